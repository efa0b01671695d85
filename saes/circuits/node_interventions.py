"""Interventions on graph nodes: ablate, clamp or steer features (or a supernode's
members) in the local replacement model and compare the logit nodes' change with what
the graph predicts.

Measured: `saes.circuits.perturb.node_values` with the edited activations; with
`recompute=True` (the default) downstream features re-encode their live inputs (errors
fixed, attention and norms frozen), with `recompute=False` they keep their activations.
Predicted, from the adjacency alone: `direct`, the edges from the edited nodes to each logit
node; `total`, the change carried along every path of the graph with each feature treated
as linear in its pre-activation (slope 1 while active, as for ReLU, TopK and JumpReLU).
Over transcoders `direct` equals the measured change without recomputation, and `total`
the recomputed change as long as no feature crosses its threshold. `influence_ranked` and
`density_matched` pick a graph's top nodes and their random control.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.circuits.graph import Graph
from sae_atlas.saes.circuits.perturb import node_values
from sae_atlas.saes.models import ModelHandle

NodeEditKind = Literal["ablate", "clamp", "steer"]


@dataclass
class NodeEdit:
    """Set the feature nodes `nodes` to zero (ablate), to `value` (clamp) or add `value`
    to their activations (steer)."""

    kind: NodeEditKind
    nodes: list[int]
    value: float = 0.0


@dataclass
class InterventionResult:
    """Per logit node: token, clean value (demeaned logit), measured change, and the graph's
    direct and total predictions."""

    tokens: list[str]
    clean: list[float]
    measured: list[float]
    direct: list[float]
    total: list[float]
    recompute: bool


def _deltas(graph: Graph, edits: list[NodeEdit]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-node scale, add, and the activation change `delta` each edit makes."""
    N, dtype = graph.n_nodes, graph.adjacency.dtype
    scale, add = torch.ones(N, dtype=dtype), torch.zeros(N, dtype=dtype)
    act = graph.features.activation.to(dtype)
    for e in edits:
        if e.kind not in ("ablate", "clamp", "steer"):
            raise InvalidInputError(f"unknown node edit {e.kind!r}; valid: ablate, clamp, steer")
        bad = [i for i in e.nodes if not 0 <= i < graph.n_features]
        if bad or not e.nodes:
            raise InvalidInputError(f"node edits act on feature nodes 0..{graph.n_features - 1}; got {e.nodes}")
        idx = torch.tensor(e.nodes)
        scale[idx] = 1.0 if e.kind == "steer" else 0.0
        add[idx] = 0.0 if e.kind == "ablate" else e.value
    delta = torch.zeros(graph.n_features, dtype=dtype)
    delta[:] = act * (scale[: graph.n_features] - 1) + add[: graph.n_features]
    return scale, add, delta


def predict(graph: Graph, delta_F: torch.Tensor, fixed_F: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(direct, total) change of the logit nodes for activation changes `delta_F` of the
    features marked `fixed_F` (the edited ones, held at their new value)."""
    n_f = graph.n_features
    per_unit = graph.adjacency[:, :n_f] / graph.features.activation.to(graph.adjacency.dtype)[None]
    logits = per_unit[graph.logit_slice]
    direct = logits @ (delta_F * fixed_F)
    delta = delta_F * fixed_F
    for _ in range(len(graph.dictionaries) + 1):
        delta = torch.where(fixed_F, delta_F, per_unit[:n_f] @ delta)
    return direct, logits @ delta


def intervene(handle: ModelHandle, graph: Graph, edits: list[NodeEdit], *, recompute: bool = True) -> InterventionResult:
    """Apply `edits` to the graph's replacement model; measured vs predicted logit changes."""
    scale, add, delta = _deltas(graph, edits)
    fixed = torch.zeros(graph.n_features, dtype=torch.bool)
    for e in edits:
        fixed[e.nodes] = True
    ones = torch.ones_like(scale)
    values = node_values(handle, graph, torch.stack([ones, scale]), torch.stack([torch.zeros_like(add), add]),
                         recompute=recompute)
    ls = graph.logit_slice
    measured = values[1, ls] - values[0, ls]
    if not bool(torch.isfinite(measured).all()):
        raise InvalidInputError(
            "the replacement model diverged under this edit (non-finite logits): with norm scales frozen at "
            "their clean values, removing a large activation (e.g. a massive-activation feature) lets later "
            "MLPs grow without bound; edit fewer or smaller nodes, or measure the edit in the model itself "
            "(`Atlas.run` with ablate / clamp edits)")
    direct, total = predict(graph, delta, fixed)
    return InterventionResult(graph.logits.tokens, values[0, ls].tolist(), measured.tolist(), direct.tolist(),
                              total.tolist(), recompute)


def influence_ranked(graph: Graph) -> list[int]:
    """Feature nodes from the most to the least influential on the targets (the order the
    pruning keeps them in, `saes.circuits.prune`)."""
    from sae_atlas.saes.circuits.prune import prune

    cumulative = prune(graph).cumulative
    return sorted(range(graph.n_features), key=lambda i: float(cumulative[i]))


def density_matched(graph: Graph, nodes: list[int], density: Callable[[int], float], *, seed: int = 0,
                    pool: int = 10) -> list[int]:
    """The control for ablating `nodes`: for each, a random other active feature node of the
    same dictionary among the `pool` whose `density(node)` (firing density of its latent)
    is nearest, seeded and without repeats."""
    gen = torch.Generator().manual_seed(seed)
    dictionary = graph.features.dictionary
    chosen: list[int] = []
    for i in nodes:
        candidates = [j for j in (dictionary == dictionary[i]).nonzero()[:, 0].tolist()
                      if j not in nodes and j not in chosen]
        if not candidates:
            raise InvalidInputError(f"no other active feature of node {i}'s dictionary to match it with")
        near = sorted(candidates, key=lambda j: abs(density(j) - density(i)))[:pool]
        chosen.append(near[int(torch.randint(len(near), (1,), generator=gen))])
    return chosen
