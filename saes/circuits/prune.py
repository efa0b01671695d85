"""Influence, pruning and the graph's scores, as circuit-tracer defines them (`graph.py`:
`normalize_matrix`, `compute_influence`, `prune_graph`, `compute_graph_scores`; Ameisen
et al. 2025, "Circuit Tracing", § "Graph pruning" and "Evaluating graphs").

- Normalised adjacency: `|A|` with each row divided by its sum (each node's inputs share 1).
- Influence of every node on the logit nodes: `w (Â + Â^2 + ...)`, `w` the logit nodes'
  probabilities; the series ends because the graph has no cycles.
- Pruning keeps the nodes holding `node_threshold` of the cumulative influence (tokens and
  logits always), then the edges holding `edge_threshold` of the cumulative edge score
  (`Â[t, s]` times the target's influence plus its logit weight), then drops feature and
  error nodes left without an outgoing edge and features left without an incoming one.
- Replacement score: the share of the tokens' influence among tokens and errors.
- Completeness score: over all nodes weighted by influence plus logit weight, the share of
  each node's normalised input that does not come from error nodes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.circuits.graph import Graph


def normalized(adjacency: torch.Tensor) -> torch.Tensor:
    """`|A|` with every row summing to 1 (rows without inputs stay zero)."""
    a = adjacency.abs()
    return a / a.sum(1, keepdim=True).clamp(min=1e-10)


def influence(norm_adjacency: torch.Tensor, weights: torch.Tensor, max_steps: int = 1000) -> torch.Tensor:
    """`weights @ (Â + Â^2 + ...)`: each node's total influence on the weighted nodes."""
    step = weights @ norm_adjacency
    total = step.clone()
    for _ in range(max_steps):
        if not step.any():
            return total
        step = step @ norm_adjacency
        total += step
    raise InvalidInputError(f"influence did not vanish after {max_steps} steps: the graph has a cycle")


def _cut(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """The smallest score kept when keeping the top scores up to `fraction` of their total."""
    ordered = scores.sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum().clamp(min=1e-30)
    i = int(torch.searchsorted(cumulative, torch.tensor(fraction, dtype=cumulative.dtype)))
    return ordered[min(i, len(ordered) - 1)]


class Pruned(NamedTuple):
    """Which nodes and edges (`[N]`, `[N, N]` bool, rows targets) survive, and every node's
    place in the cumulative influence (0..1; low is influential)."""

    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    cumulative: torch.Tensor


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """Prune `graph` by influence (see the module docstring)."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise InvalidInputError(f"{name} must be in [0, 1], got {value}")
    A, w = graph.adjacency, graph.logit_weights()
    keep_always = graph.token_slice.start
    node_inf = influence(normalized(A), w)
    node_mask = node_inf >= _cut(node_inf, node_threshold)
    node_mask[keep_always:] = True
    pruned = A.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    norm = normalized(pruned)
    edge_scores = norm * (influence(norm, w) + w)[:, None]
    edge_mask = edge_scores >= _cut(edge_scores.flatten(), edge_threshold)
    n_f = graph.n_features
    while True:
        before = node_mask.clone()
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[:keep_always] &= edge_mask[:, :keep_always].any(0)
        node_mask[:n_f] &= edge_mask[:n_f].any(1)
        if torch.equal(before, node_mask):
            break
    order = node_inf.sort(descending=True)
    cumulative = torch.zeros_like(node_inf)
    cumulative[order.indices] = order.values.cumsum(0) / order.values.sum().clamp(min=1e-30)
    return Pruned(node_mask, edge_mask, cumulative)


class Scores(NamedTuple):
    """circuit-tracer's graph scores (1 when every path runs through features)."""

    replacement: float
    completeness: float


def scores(graph: Graph, adjacency: torch.Tensor | None = None) -> Scores:
    """Replacement and completeness scores of `graph` (or of `adjacency` in its layout,
    e.g. a pruned one)."""
    A = graph.adjacency if adjacency is None else adjacency
    w = graph.logit_weights()
    norm = normalized(A)
    node_inf = influence(norm, w)
    tokens, errors = node_inf[graph.token_slice].sum(), node_inf[graph.error_slice].sum()
    replacement = float(tokens / (tokens + errors).clamp(min=1e-30))
    non_error = 1 - norm[:, graph.error_slice].sum(1)
    weight = node_inf + w
    return Scores(replacement, float((non_error * weight).sum() / weight.sum()))
