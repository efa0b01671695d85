"""The parameter layer of `compare`; its other layers: `sae_atlas.api.commands.compare` (CLI),
`sae_atlas.api.http.routers.compare` (HTTP), `sae_atlas.api.results.compare` (typed-result),
`sae_atlas.api.services.compare` (service).

The comparison's parameters (`Atlas.compare`, `sae-atlas compare`): how much of the
corpus to stream through both models and how to score the two SAEs."""

from __future__ import annotations

from pydantic import Field

from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import Operation

STREAMED = ("n_tokens", "batch_blocks", "sample_tokens", "max_items", "n_perm", "n_rotations", "min_fires", "seed")
"""The fields `saes.compare.saes_pair.CompareParams` takes."""


class CompareOptions(Operation):
    """Two SAEs compared: MCC and mutual nearest neighbours of activation correlations,
    decoder matching, SVCCA / RSA beside their nulls."""

    n_tokens: JsonInt = Field(default=20_000, ge=2, description="corpus tokens to stream (shared or aligned)")
    batch_blocks: JsonInt = Field(default=8, ge=1, description="blocks per forward pass")
    sample_tokens: JsonInt = Field(default=2048, ge=3, description="tokens whose codes feed the activation-space "
                                                                   "scores")
    max_items: JsonInt = Field(default=1024, ge=3, description="matched pairs entering SVCCA / RSA (a seeded subset "
                                                               "beyond)")
    n_perm: JsonInt = Field(default=50, ge=1, description="null draws per space score")
    n_rotations: JsonInt = Field(default=1, ge=1, description="rotation-null accumulators streamed beside the real "
                                                              "one (20 or more for an MCC p-value below 0.05)")
    min_fires: JsonInt = Field(default=10, ge=0, description="latents firing on fewer tokens are left out of the "
                                                             "matching")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the nulls and subsets")
    decoder: bool | None = Field(default=None, description="match decoder cosines too (default: when the SAEs "
                                                           "share d_model)")
    groups: str | None = Field(default=None, min_length=1, max_length=300,
                               description="score per group of A's latents from a stored run KIND/RUN[:COLUMN], "
                                           "e.g. lobes/<run>")
    run: SafeId | None = Field(default=None, description="run name (default <sae_a>--<sae_b>)")
