"""The engine layer of `graph`; its other layers: `sae_atlas.api.commands.graph` (CLI),
`sae_atlas.api.http.routers.graph` (HTTP), `sae_atlas.api.operations.graph` (parameter),
`sae_atlas.api.results.graph` (typed-result), `sae_atlas.api.services.graph` (service).

An attribution graph: nodes and the direct-effect adjacency between them.

Nodes are laid out as circuit-tracer lays them out (`graph.py`): active features (by
dictionary, then position, then latent), error nodes (one per dictionary and position,
dictionary-major), token embeddings (one per position), logit nodes. `adjacency[t, s]`
is the direct effect of source `s` on target `t`: on a feature, its pre-activation; on a
logit node, the demeaned logit (see `saes.circuits.targets`). Rows of error and token nodes
are zero (nothing is upstream of a token; errors are fixed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sae_atlas.saes.circuits.dictionaries import DictionarySet, GraphKind
from sae_atlas.saes.circuits.replacement import Capture
from sae_atlas.saes.circuits.targets import LogitTargets


@dataclass
class FeatureNodes:
    """The active features: dictionary index (into `Graph.dictionaries`), position, latent,
    activation; all `[n]`."""

    dictionary: torch.Tensor
    pos: torch.Tensor
    latent: torch.Tensor
    activation: torch.Tensor

    def __len__(self) -> int:
        return len(self.latent)


@dataclass
class Graph:
    """One prompt's attribution graph (see the module docstring).

    `linear` says whether every edge is an exact direct effect (transcoders at every MLP) or
    a first-order one (residual SAEs: the MLPs between them stay non-linear). `values` holds
    each row's clean value: a feature's pre-activation or a logit node's demeaned logit (NaN
    for error and token nodes)."""

    prompt: str
    tokens: list[str]
    token_ids: list[int]
    kind: GraphKind
    dictionaries: list[str]
    layers: list[int]  # each dictionary's block
    hooks: list[tuple[str, str]]  # each dictionary's (read, write) hooks
    features: FeatureNodes
    logits: LogitTargets
    adjacency: torch.Tensor  # [N, N], rows targets, columns sources
    values: torch.Tensor  # [N]
    linear: bool
    start: int  # first position with nodes (1 after a BOS token)
    settings: dict[str, Any] = field(default_factory=dict)
    replacement: tuple[DictionarySet, Capture] | None = field(default=None, repr=False)

    @property
    def n_pos(self) -> int:
        return len(self.token_ids)

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_errors(self) -> int:
        return len(self.dictionaries) * self.n_pos

    @property
    def n_nodes(self) -> int:
        return self.n_features + self.n_errors + self.n_pos + len(self.logits.ids)

    @property
    def error_slice(self) -> slice:
        return slice(self.n_features, self.n_features + self.n_errors)

    @property
    def token_slice(self) -> slice:
        start = self.n_features + self.n_errors
        return slice(start, start + self.n_pos)

    @property
    def logit_slice(self) -> slice:
        return slice(self.n_nodes - len(self.logits.ids), self.n_nodes)

    def error_index(self, dictionary: int, pos: int) -> int:
        """Node index of a dictionary's error node at `pos`."""
        return self.n_features + dictionary * self.n_pos + pos

    def feature_index(self, dictionary: str, latent: int, pos: int) -> int:
        """Node index of feature `latent` of `dictionary` at `pos` (KeyError when not active)."""
        d = self.dictionaries.index(dictionary)
        f = self.features
        hit = ((f.dictionary == d) & (f.latent == latent) & (f.pos == pos)).nonzero()
        if not len(hit):
            raise KeyError(f"feature {latent} of {dictionary} is not active at position {pos}")
        return int(hit[0, 0])

    def node_kind(self, i: int) -> str:
        """'feature', 'error', 'token' or 'logit'."""
        if i < self.n_features:
            return "feature"
        if i < self.token_slice.start:
            return "error"
        return "token" if i < self.logit_slice.start else "logit"

    def logit_weights(self) -> torch.Tensor:
        """`[N]`: each logit node's probability, zero elsewhere (the weights influence starts from)."""
        w = torch.zeros(self.n_nodes, dtype=self.adjacency.dtype)
        w[self.logit_slice] = self.logits.probs.to(w.dtype)
        return w
