"""The parameter layer of `crosscoder`; its other layers: `sae_atlas.api.results.crosscoder`
(typed-result), `sae_atlas.api.services.crosscoder` (service),
`sae_atlas.saes.compare.crosscoder` (engine).

The crosscoder's parameters (`Atlas.train_crosscoder`, `sae-atlas train-crosscoder`;
`Atlas.latent_scaling`, `sae-atlas latent-scaling`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import Operation


class CrosscoderParams(Operation):
    """A crosscoder between `hook_a` of the atlas's model and `hook_b` of `model_b`."""

    renamed = {"n_tokens": "tokens"}

    hook_a: str = Field(min_length=1, max_length=200, description="hook of model A (the atlas's model)")
    hook_b: str = Field(min_length=1, max_length=200, description="hook of model B (another layer, or the same "
                                                                  "layer of model_b)")
    model_b: Any = Field(default=None, description="model B (smollm2-135m, a Hugging Face id or folder, a .gguf, a "
                                                   "tiny spec); default the atlas's model")
    d_sae: JsonInt = Field(default=4096, ge=1, description="crosscoder latents")
    k: JsonInt = Field(default=32, ge=1, description="mean active latents per token (BatchTopK)")
    tokens: JsonInt = Field(default=200_000, ge=1, description="training tokens")
    pass_tokens: JsonInt | None = Field(default=None, ge=2, description="corpus tokens per pass (default tokens; "
                                                                        "passes repeat)")
    batch_size: JsonInt = Field(default=1024, ge=1, description="rows per training step")
    batch_blocks: JsonInt = Field(default=8, ge=1, description="blocks per forward pass")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the shuffle and the initialisation")
    cc_id: SafeId | None = Field(default=None, description="crosscoder id (default <hook_a>--<hook_b>-<d_sae>)")
    scaling_tokens: JsonInt = Field(default=0, ge=0, description="then Latent Scaling of every latent over this many "
                                                                 "corpus tokens (0: skip)")


class LatentScalingParams(Operation):
    """Latent Scaling (Minder et al. 2025) of the latents of a stored crosscoder."""

    renamed = {"n_tokens": "tokens"}

    cc_id: SafeId = Field(description="the crosscoder (crosscoders/<id>/)")
    tokens: JsonInt = Field(default=50_000, ge=2, description="corpus tokens to stream")
    batch_blocks: JsonInt = Field(default=8, ge=1, description="blocks per forward pass")
