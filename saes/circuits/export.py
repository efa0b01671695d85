"""A pruned graph as circuit-tracer's graph JSON, the file its frontend and Neuronpedia draw.

Format: `schema_version` 1 of decoderesearch/circuit-tracer (`circuit_tracer/frontend/
graph_models.py` and `utils/create_graph_files.py`; the layout of its test fixture
`tests/fixtures/graphs/123-gemma-3-1b-pt-gemmascope2-16k.json`, commit e1a5b03c). Top-level
`metadata`, `qParams`, `nodes`, `links`:
- feature node `"{layer}_{latent}_{pos}"`, `feature` the Cantor pairing of (layer, latent),
  `feature_type` "cross layer transcoder" (what the frontend draws as a feature);
- error node `"{layer}_-1_{pos}"`, "mlp reconstruction error" (transcoders, CLT) or "residual
  reconstruction error" (residual SAEs; the frontend treats any type containing "error" as one);
- token node `"E_{token_id}_{pos}"`, "embedding"; logit node `"{n+1}_{token_id}_{last}"`, "logit";
- links `{source, target, weight}` with the adjacency entry as weight.
`layer` is the dictionary's place in the graph (the block for transcoders and a CLT). Fields the
format does not have ride along: feature nodes carry `sae_id` (a CLT layer's, which has no
feature pages, `dictionary`) and `hook`, and
`metadata.sae_atlas` carries the kind, scores and dictionaries; readers ignore them.
"""

from __future__ import annotations

from typing import Any

from sae_atlas.saes.circuits.graph import Graph
from sae_atlas.saes.circuits.prune import Pruned, Scores

SCHEMA_VERSION = 1
SOURCE = "decoderesearch/circuit-tracer circuit_tracer/frontend/graph_models.py, schema_version 1"


def cantor(x: int, y: int) -> int:
    """The Cantor pairing circuit-tracer numbers features with."""
    return (x + y) * (x + y + 1) // 2 + y


def _node(node_id: str, feature: int, layer: str, ctx: int, kind: str, js: str, **extra: Any) -> dict[str, Any]:
    return {"node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": ctx, "feature_type": kind,
            "token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js,
            "clerp": "", "influence": None, "activation": None, **extra}


def node_ids(graph: Graph) -> list[str]:
    """Every node's circuit-tracer id, in the graph's node order."""
    f, T = graph.features, graph.n_pos
    ids = [f"{d}_{lat}_{p}" for d, lat, p in zip(f.dictionary.tolist(), f.latent.tolist(), f.pos.tolist(), strict=True)]
    ids += [f"{d}_-1_{p}" for d in range(len(graph.dictionaries)) for p in range(T)]
    ids += [f"E_{t}_{p}" for p, t in enumerate(graph.token_ids)]
    ids += [f"{len(graph.dictionaries) + 1}_{t}_{T - 1}" for t in graph.logits.ids]
    return ids


def graph_json(graph: Graph, pruned: Pruned, *, slug: str, scan: str, scores: Scores | None = None,
               labels: dict[tuple[str, int], str] | None = None,
               supernodes: list[list[str]] | None = None, node_threshold: float = 0.8,
               edge_threshold: float = 0.98) -> dict[str, Any]:
    """The kept nodes and edges of `graph` (`pruned`) as circuit-tracer graph JSON. `labels`
    ((dictionary id, latent) -> text) fill the features' `clerp`; `supernodes` (lists of
    `[label, node_id, ...]`) go to `qParams.supernodes`."""
    ids, f, T = node_ids(graph), graph.features, graph.n_pos
    labels = labels or {}
    error_type = "residual reconstruction error" if graph.kind == "residual" else "mlp reconstruction error"
    n_d = len(graph.dictionaries)
    nodes = []
    for i in pruned.node_mask.nonzero()[:, 0].tolist():
        infl = float(pruned.cumulative[i])
        kind = graph.node_kind(i)
        if kind == "feature":
            d, lat, p = int(f.dictionary[i]), int(f.latent[i]), int(f.pos[i])
            sid = graph.dictionaries[d]
            nodes.append(_node(ids[i], cantor(d, lat), str(d), p, "cross layer transcoder", f"{d}_{lat}-0",
                               clerp=labels.get((sid, lat), ""), influence=infl,
                               activation=float(f.activation[i]), hook=graph.hooks[d][1],
                               **({"dictionary": sid} if graph.kind == "clt" else {"sae_id": sid})))
        elif kind == "error":
            d, p = divmod(i - graph.error_slice.start, T)
            nodes.append(_node(ids[i], -1, str(d), p, error_type, f"{d}_-1-{p}", influence=infl))
        elif kind == "token":
            p = i - graph.token_slice.start
            nodes.append(_node(ids[i], p, "E", p, "embedding", f"E_{graph.token_ids[p]}-{p}", influence=infl))
        else:
            j = i - graph.logit_slice.start
            tok, prob = graph.logits.ids[j], float(graph.logits.probs[j])
            nodes.append(_node(ids[i], tok, str(n_d + 1), T - 1, "logit", f"L_{tok}-{T - 1}", token_prob=prob,
                               is_target_logit=j == 0,
                               clerp=f'Output "{graph.logits.tokens[j]}" (p={prob:.3f})'))
    kept = pruned.edge_mask & pruned.node_mask[:, None] & pruned.node_mask[None]
    dst, src = kept.nonzero(as_tuple=True)
    weights = graph.adjacency[dst, src].tolist()
    links = [{"source": ids[s], "target": ids[t], "weight": w}
             for s, t, w in zip(src.tolist(), dst.tolist(), weights, strict=True)]
    used = {x["source"] for x in links} | {x["target"] for x in links}
    nodes = [n for n in nodes if n["node_id"] in used or n["feature_type"] in ("embedding", "logit")]
    settings = graph.settings
    meta = {
        "slug": slug, "scan": scan, "transcoder_list": list(graph.dictionaries), "prompt_tokens": graph.tokens,
        "prompt": graph.prompt, "node_threshold": node_threshold, "schema_version": SCHEMA_VERSION,
        "info": {"creator_name": "sae-atlas", "generator": {"name": "sae-atlas saes.circuits", "version": "0.1.0"}},
        "generation_settings": {"max_n_logits": settings.get("max_logits"),
                                "desired_logit_prob": settings.get("cumulative_prob"),
                                "batch_size": settings.get("batch_size")},
        "pruning_settings": {"node_threshold": node_threshold, "edge_threshold": edge_threshold},
        "sae_atlas": {"kind": graph.kind, "linear": graph.linear,
                      "scores": None if scores is None else scores._asdict(),
                      "dictionaries": [{"id": sid, "layer": layer, "read_hook": r, "write_hook": w}
                                       for sid, layer, (r, w) in zip(graph.dictionaries, graph.layers, graph.hooks,
                                                                     strict=True)],
                      "nodes_before_pruning": graph.n_nodes,
                      "edges_before_pruning": int((graph.adjacency != 0).sum())},
    }
    qparams = {"pinnedIds": [], "supernodes": supernodes or [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": meta, "qParams": qparams, "nodes": nodes, "links": links}
