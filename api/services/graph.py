"""The service layer of `graph`; its other layers: `sae_atlas.api.commands.graph` (CLI),
`sae_atlas.api.http.routers.graph` (HTTP), `sae_atlas.api.operations.graph` (parameter),
`sae_atlas.api.results.graph` (typed-result), `sae_atlas.saes.circuits.graph` (engine).

Attribution graphs over an atlas (the model runs in `saes.circuits`): the dictionaries
are chosen and checked, the prompt bounded (`api.bounds`), supernodes read from the stored
geometry records (circles, concept spans, lobes) and node interventions resolved against
the graph's node ids."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from sae_atlas.api.bounds import (
    MAX_GRAPH_FEATURES,
    MAX_GRAPH_TOKENS,
    check_int,
)
from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.graph import GraphParams
from sae_atlas.api.operations.graph import NodeEdit as NodeEditParams
from sae_atlas.api.results.graph import GraphNode, GraphView, NodeIntervention
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services.interventions import _tokenize
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.circuits.adjacency import build_graph
from sae_atlas.saes.circuits.export import graph_json, node_ids
from sae_atlas.saes.circuits.graph import Graph
from sae_atlas.saes.circuits.node_interventions import NodeEdit, intervene
from sae_atlas.saes.circuits.prune import Pruned, prune, scores
from sae_atlas.saes.circuits.supernodes import Group, Supernode, supernodes
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.transcoders.clt import CrossLayerTranscoder
from sae_atlas.saes.transcoders.clt_store import load_atlas_clt
from sae_atlas.store.hooks import hook_layer

_USABLE_SAE = re.compile(r"^blocks\.\d+\.hook_resid_(pre|post)$")


def graph_saes(ctx: AtlasContext, views: list[SaeView], *, chosen: bool, freeze_mlps: bool = False,
               clt: str | None = None) -> dict[str, SAE | CrossLayerTranscoder]:
    """The dictionaries of a graph: the cross-layer transcoder `clt`; else `views` as given
    when `chosen`; else the atlas's CLT when it has one (InvalidInputError naming them when it
    has several), its transcoders when they replace every MLP (or `freeze_mlps`), its
    residual-stream SAEs, its transcoders (the graph then names the MLPs they miss);
    NotFoundError when none fits."""
    if clt is not None:
        module = load_atlas_clt(ctx.root, clt)  # NotFoundError naming the valid ids first
        if chosen:
            raise InvalidInputError("a graph is over SAEs / transcoders (saes) or over a cross-layer transcoder "
                                    "(clt), not both")
        return {clt: module}
    clts = ctx.layout.clt_ids()
    if not chosen and len(clts) > 1:
        raise InvalidInputError(f"the atlas has several cross-layer transcoders ({', '.join(clts)}); choose one "
                                "(clt=..., --clt)")
    if not chosen and clts:
        return {clts[0]: load_atlas_clt(ctx.root, clts[0])}
    modules = {v.sae_id: v.module() for v in views}
    if chosen:
        return modules
    transcoders = {sid: m for sid, m in modules.items() if m.is_transcoder}
    residual = {sid: m for sid, m in modules.items() if not m.is_transcoder and _USABLE_SAE.match(m.cfg.hook_name)}
    every_mlp = len({hook_layer(m.cfg.hook_name) for m in transcoders.values()}) == ctx.model().n_layers
    if transcoders and (every_mlp or freeze_mlps or not residual):
        return transcoders
    if residual:
        return residual
    have = ", ".join(f"{v.sae_id} at {v.hook}" for v in views) or "none"
    raise NotFoundError(f"the atlas {ctx.root} has no transcoder or residual-stream SAE (hook_resid_pre/post) "
                        f"a graph can use, and no cross-layer transcoder; its SAEs: {have}")


def _geometry_groups(views: Sequence[SaeView], ids: list[str]) -> dict[str, Group]:
    """Supernode groups from the stored geometry records of the graph's dictionaries: one per
    circle, concept span or lobe (hierarchy records name single latents and are left out)."""
    groups: dict[str, Group] = {}
    for view in views:
        if view.sae_id not in ids:
            continue
        records = view.records("geometry")
        for row in records.filter(records["kind"] != "hierarchy").iter_rows(named=True):
            name = row["name"] if row["kind"] != "concept" else row["name"].split(":")[0]
            label = f"{row['kind']} {name} ({view.sae_id}, {row['run']})"
            groups.setdefault(label, []).append((view.sae_id, int(row["latent"])))
    return groups


def _labels(views: Sequence[SaeView], graph: Graph, pruned: Pruned) -> dict[tuple[str, int], str]:
    kept = pruned.node_mask[: graph.n_features]
    out: dict[tuple[str, int], str] = {}
    for view in views:
        if view.sae_id not in graph.dictionaries or not view.summarized:
            continue
        d = graph.dictionaries.index(view.sae_id)
        latents = set(graph.features.latent[kept & (graph.features.dictionary == d)].tolist())
        frame = view.labels_by_latent()
        for row in frame.filter(frame["latent"].is_in(list(latents))).iter_rows(named=True):
            if row["label"]:
                out[(view.sae_id, int(row["latent"]))] = row["label"]
    return out


def _top_nodes(graph: Graph, pruned: Pruned, ids: list[str], labels: dict[tuple[str, int], str],
               k: int) -> list[GraphNode]:
    kept = [i for i in pruned.node_mask.nonzero()[:, 0].tolist() if i < graph.token_slice.start]
    kept.sort(key=lambda i: float(pruned.cumulative[i]))
    f, out = graph.features, []
    for i in kept[:k]:
        kind = graph.node_kind(i)
        if kind == "feature":
            sid, lat, pos = graph.dictionaries[int(f.dictionary[i])], int(f.latent[i]), int(f.pos[i])
            act: float | None = float(f.activation[i])
        else:
            d, pos = divmod(i - graph.error_slice.start, graph.n_pos)
            sid, lat, act = graph.dictionaries[d], None, None
        out.append({"node_id": ids[i], "kind": kind, "sae_id": sid, "latent": lat, "position": pos,
                    "token": graph.tokens[pos], "activation": act, "influence": float(pruned.cumulative[i]),
                    "label": labels.get((sid, lat), "") if lat is not None else ""})
    return out


def _edit(graph: Graph, ids: list[str], groups: list[Supernode], spec: NodeEditParams
          ) -> tuple[NodeEdit, dict[str, Any]]:
    node, kind, value, recompute = spec.node, spec.kind, spec.value, spec.recompute
    by_label = {s.label: s.members for s in groups}
    if node in by_label:
        members = by_label[node]
    elif node in ids and ids.index(node) < graph.n_features:
        members = [ids.index(node)]
    else:
        raise InvalidInputError(f"node {node!r} is not a feature node or supernode of this graph; feature nodes are "
                                f"'layer_latent_position' ids such as {ids[0]!r}")
    return NodeEdit(kind, members, value), {"node": node, "kind": kind, "value": value, "recompute": recompute}


def graph(ctx: AtlasContext, views: list[SaeView], params: GraphParams, *, batch_size: int = 64) -> GraphView:
    """The pruned attribution graph of the next token after `params.text` over `views`
    (chosen by the caller when `params.saes` names them; see `Atlas.graph`)."""
    batch_size = check_int(batch_size, "batch_size", 1, 1024)
    text, targets, top = params.text, list(params.targets or []), params.top
    node_threshold, edge_threshold = params.node_threshold, params.edge_threshold
    freeze_mlps, clt = params.freeze_mlps, params.clt
    handle = ctx.model()
    tokens_T, _ = _tokenize(handle, text)
    if len(tokens_T) > MAX_GRAPH_TOKENS:
        raise InvalidInputError(f"the prompt is {len(tokens_T)} tokens; a graph takes at most {MAX_GRAPH_TOKENS}")
    saes = graph_saes(ctx, views, chosen=bool(params.saes), freeze_mlps=freeze_mlps, clt=clt)
    started = time.perf_counter()
    with ctx.model_lock:
        g = build_graph(handle, saes, tokens_T, targets=targets or None, max_logits=params.max_logits,
                        cumulative_prob=params.cumulative_prob, batch_size=batch_size,
                        max_features=MAX_GRAPH_FEATURES, freeze_mlps=freeze_mlps)
    seconds = time.perf_counter() - started
    p = prune(g, node_threshold, edge_threshold)
    ids = node_ids(g)
    chosen_groups = params.supernodes
    groups = chosen_groups if isinstance(chosen_groups, dict) else (
        _geometry_groups(views, g.dictionaries) if chosen_groups else {})
    sns = supernodes(g, groups, by_position=params.by_position)
    kept_sn = [[s.label, *[ids[i] for i in s.members if p.node_mask[i]]] for s in sns]
    edits = [_edit(g, ids, sns, spec) for spec in params.interventions]
    done: list[NodeIntervention] = []
    with ctx.model_lock:
        for edit, desc in edits:
            r = intervene(handle, g, [edit], recompute=desc["recompute"])
            done.append({**desc, "tokens": r.tokens, "measured": r.measured, "direct": r.direct, "total": r.total})
    labels = _labels(views, g, p)
    full, pruned_adj = scores(g), g.adjacency * (p.edge_mask & p.node_mask[:, None] & p.node_mask[None])
    after = scores(g, pruned_adj)
    data = graph_json(g, p, slug=re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48] or "graph",
                      scan=handle.name, scores=full, labels=labels,
                      supernodes=[s for s in kept_sn if len(s) > 1], node_threshold=node_threshold,
                      edge_threshold=edge_threshold)
    size = {"nodes": g.n_nodes, "edges": int((g.adjacency != 0).sum()), "kept_nodes": len(data["nodes"]),
            "kept_edges": len(data["links"]), "features": g.n_features}
    lt = g.logits
    return GraphView(
        text=text, tokens=g.tokens, kind=g.kind, linear=g.linear, dictionaries=g.dictionaries,
        targets=[{"token": t, "token_id": i, "prob": float(pr), "value": float(v)} for t, i, pr, v in
                 zip(lt.tokens, lt.ids, lt.probs.tolist(), g.values[g.logit_slice].tolist(), strict=True)],
        scores=full._asdict(), pruned_scores=after._asdict(), size=size,
        top_nodes=_top_nodes(g, p, ids, labels, top), supernodes=kept_sn, interventions=done, graph=data,
        build_seconds=seconds, circuit=g)
