"""The parameter layer of `depth`; its other layers: `sae_atlas.api.analyses.depth` (analysis-run),
`sae_atlas.api.http.routers.depth` (HTTP), `sae_atlas.api.results.depth` (typed-result),
`sae_atlas.api.services.depth` (service).

The depth analysis's parameters (`Atlas.depth_profile`, `sae-atlas analyze depth`): which
layers, how much of the corpus, the estimators' sizes; or the same per prompt family
(`families`), or model A against model B on the same texts (`model_b`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import Operation
from sae_atlas.geometry.trajectories import TrajectorySpace

Layer = Annotated[int, Field(ge=0, le=10_000)]
"""A layer number (checked against the model's layers when it is loaded)."""


class DepthParams(Operation):
    """The residual stream across layers from one streamed forward: intrinsic and local
    dimension, trajectories, CKA between layers, logit and tuned lenses."""

    renamed = {"n_tokens": "tokens", "sae_ids": "saes"}

    layers: list[Layer] | None = Field(default=None, max_length=10_000,
                                       description="layers to read, at least 3 (default: every layer)")
    tokens: JsonInt = Field(default=16384, ge=1, description="corpus tokens to stream")
    batch_blocks: JsonInt = Field(default=8, ge=1, description="blocks per forward pass")
    max_points: JsonInt = Field(default=4000, ge=10, description="seeded token subsample for ID, local ID and "
                                                                 "trajectories")
    k: JsonInt = Field(default=20, ge=3, description="neighbours of the local intrinsic dimension")
    mle_k: JsonInt = Field(default=10, ge=3, description="neighbours of the global MLE dimension")
    n_boot: JsonInt = Field(default=200, ge=1, description="bootstrap draws of the MLE dimension's interval")
    fit_fraction: float = Field(default=0.25, gt=0.0, lt=1.0, description="share of the batches (the first ones) "
                                                                          "fitting the tuned lens")
    space: TrajectorySpace = Field(default="raw", description="trajectories on raw or unit-normalised states")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the subsample and bootstrap")
    saes: list[SafeId] | None = Field(default=None, description="stored SAEs on the residual stream of a read layer "
                                                                "whose features get the local ID and trajectory of "
                                                                "the tokens they fire on (default: none)")
    checkpoint_every: JsonInt | None = Field(default=None, ge=1, description="checkpoint the stream every this many "
                                             "batches (default: every minute, or ten times the last write's "
                                             "duration when longer)")
    families: Path | None = Field(default=None, description="JSON {\"families\": {name: [prompts]}}: metrics per "
                                                            "prompt family and their permutation tests instead of "
                                                            "the corpus stream")
    n_permutations: JsonInt = Field(default=2000, ge=1, description="with families or model_b: permutations per "
                                                                    "test")
    model_b: str | None = Field(default=None, min_length=1, max_length=1000,
                                description="model B on the same texts (an atlas directory: its model; or a model "
                                            "spec): CKA of every layer of A against every layer of B and, at the "
                                            "same layers, the ID and local-ID shift from A to B with its null")
    layers_b: list[Layer] | None = Field(default=None, max_length=10_000,
                                         description="with model_b: B's layers (default: layers when B has them, "
                                                     "else every layer of B)")
    run: SafeId | None = Field(default=None, description="run name (default: depth, depth-families with families, "
                                                         "depth-pair with model_b)")

    @model_validator(mode="after")
    def _one_mode(self) -> DepthParams:
        if self.families is not None and self.model_b is not None:
            raise ValueError("families and model_b are two different runs; give one")
        if self.layers_b is not None and self.model_b is None:
            raise ValueError("layers_b needs model_b")
        return self

    def run_name(self) -> str:
        """The stored run's name: `run`, else the mode's default."""
        return self.run or ("depth-families" if self.families is not None else
                            "depth-pair" if self.model_b is not None else "depth")
