"""The parameter layer of `graph`; its other layers: `sae_atlas.api.commands.graph` (CLI),
`sae_atlas.api.http.routers.graph` (HTTP), `sae_atlas.api.results.graph` (typed-result),
`sae_atlas.api.services.graph` (service), `sae_atlas.saes.circuits.graph` (engine).

The attribution graph's parameters (`Atlas.graph`, `POST /graph`, `sae-atlas graph`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sae_atlas.api.bounds import (
    MAX_GRAPH_NODE_EDITS,
    MAX_GRAPH_TARGETS,
    MAX_SAES_PER_QUERY,
)
from sae_atlas.api.operations.fields import Index, JsonInt, Prompt, SafeId
from sae_atlas.api.operations.operation import WHICH_SAES, Operation

Token = Annotated[str, Field(min_length=1, max_length=200)] | Index
"""A target token: its text (one token of the vocabulary) or its id."""
Member = Annotated[tuple[SafeId, Index], Field(strict=False)]
"""A feature of a supernode: (SAE id, latent); a JSON array of two."""


class NodeEdit(Operation):
    """An edit of one graph node (a feature node id such as `1_12_5`, or a supernode label)."""

    node: str = Field(min_length=1, max_length=300)
    kind: Literal["ablate", "clamp", "steer"] = "ablate"
    value: float = Field(default=0.0, ge=-1e6, le=1e6, description="clamp: the activation; steer: added to it")
    recompute: bool = Field(default=True, description="downstream features re-encode (false: they stay fixed)")


class GraphParams(Operation):
    """An attribution graph of the next token after `text`."""

    renamed = {"sae_ids": "saes", "target": "targets"}

    text: Prompt
    targets: list[Token] | None = Field(default=None, max_length=MAX_GRAPH_TARGETS,
                                        description="target tokens (default: the top predictions up to "
                                                    "cumulative_prob)")
    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                      description=f"{WHICH_SAES}: the atlas's CLT, else its transcoders, else its "
                                                  "residual-stream SAEs")
    max_logits: JsonInt = Field(default=5, ge=1, le=MAX_GRAPH_TARGETS, description="most logit nodes without targets")
    cumulative_prob: float = Field(default=0.95, gt=0.0, le=1.0, description="logit nodes up to this probability")
    node_threshold: float = Field(default=0.8, ge=0.0, le=1.0, description="cumulative influence of the kept nodes")
    edge_threshold: float = Field(default=0.98, ge=0.0, le=1.0, description="cumulative influence of the kept edges")
    supernodes: bool | dict[Annotated[str, Field(min_length=1, max_length=200)], list[Member]] = Field(
        default=True, description="collapse stored circles, concept spans and lobes (true), none (false), or "
                                  "these groups: label -> [[sae_id, latent], ...]")
    by_position: bool = Field(default=False, description="one supernode per group and position")
    interventions: list[NodeEdit] = Field(default_factory=list, max_length=MAX_GRAPH_NODE_EDITS,
                                          description="node edits measured beside the graph's prediction")
    top: JsonInt = Field(default=20, ge=1, le=200, description="influential nodes to list")
    freeze_mlps: bool = Field(default=False, description="transcoders at some layers only: the other MLPs frozen "
                                                         "(their outputs are error nodes)")
    clt: SafeId | None = Field(default=None, description="cross-layer transcoder of the graph (default: the atlas's "
                                                         "only CLT, if it has one)")
