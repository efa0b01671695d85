"""The parameter layer of `train`; its other layers: `sae_atlas.api.commands.train` (CLI),
`sae_atlas.api.services.train` (service).

Training's parameters (`Atlas.train`, `sae-atlas train`; writes, so no HTTP route): SAEs,
per-layer transcoders or a cross-layer transcoder from the atlas's cached activations, or
(`from_model`) every requested dictionary, crosscoders of two hooks included, from one
streamed forward of the atlas's model (with `model_b`, crosscoders of two models: model B
runs on the same tokens)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from sae_atlas.api.operations.fields import JsonInt
from sae_atlas.api.operations.operation import Operation

Architecture = Literal["standard", "topk", "batchtopk", "jumprelu", "matryoshka"]
DictDtype = Literal["float32", "bfloat16", "float16"]
Hook = Annotated[str, Field(min_length=1, max_length=200)]
HookPair = Annotated[tuple[Hook, Hook], Field(strict=False)]
"""A crosscoder's two hooks (side A, side B); a JSON array of two."""
FROM_MODEL = "with from_model"


class TrainParams(Operation):
    """Train one dictionary per hook (an SAE, or with `transcode` a transcoder from an MLP's
    input to its output), or with `cross_layer` one cross-layer transcoder over the hooks;
    from the atlas's caches, or with `from_model` from one streamed forward of its model
    (plus one crosscoder per pair of `crosscoders`). An interrupted run resumes from its
    checkpoints; a finished dictionary with the same configuration is kept."""

    hooks: list[Hook] | None = Field(default=None, description="hooks to train on (default: every cached hook; "
                                                               "from_model needs them, or crosscoders)")
    arch: Architecture | None = Field(default=None, description="architecture (default topk; jumprelu for a "
                                                                "cross-layer transcoder)")
    d_sae: JsonInt | None = Field(default=None, ge=1, description="latents per dictionary (default expansion x "
                                                                  "the input width)")
    expansion: JsonInt | None = Field(default=None, ge=1, description="latents as a multiple of the input width "
                                                                      "(default 8)")
    k: JsonInt | None = Field(default=None, ge=1, description="active latents per token for topk / batchtopk / "
                                                              "matryoshka and crosscoders (default 32)")
    tokens: JsonInt | None = Field(default=None, ge=1, description="training tokens (default: one pass over the "
                                                                   "cached train split, at most 2M; 2M from_model)")
    batch_size: JsonInt | None = Field(default=None, ge=1, description="tokens per step (default 4096)")
    lr: float | None = Field(default=None, gt=0, description="Adam learning rate (default 2e-4 / "
                                                             "sqrt(d_sae / 2**14))")
    seed: JsonInt | None = Field(default=None, ge=0, le=2**31 - 1, description="seed of initialisation and data "
                                                                               "order (default 0)")
    transcode: bool = Field(default=False, description="transcoders: each hook (an MLP input, e.g. "
                                                       "blocks.L.ln2.hook_normalized) predicts blocks.L.hook_mlp_out")
    skip: bool = Field(default=False, description="transcoders with a linear skip connection (W_skip)")
    cross_layer: bool = Field(default=False, description="with transcode: one cross-layer transcoder reading every "
                                                         "hook (blocks.0..L-1 of one site) and writing every later "
                                                         "MLP output")
    crosscoders: list[HookPair] | None = Field(default=None, description=f"{FROM_MODEL}: a crosscoder per pair "
                                               "[hook_a, hook_b] of two hooks of the model, trained in the same "
                                               "forward (hook_b of model_b when given)")
    model_b: Any = Field(default=None, description=f"{FROM_MODEL} and crosscoders: model B, whose hook_b each "
                                                   "crosscoder reads, run on the same tokens (same tokenizer; "
                                                   "smollm2-135m, a Hugging Face id or folder, a .gguf, a tiny spec)")
    from_model: bool = Field(default=False, description="stream the tokens through the atlas's model (one forward "
                                                        "for every hook, no cache) instead of reading caches")
    dict_dtype: DictDtype = Field(default="float32", description=f"{FROM_MODEL}: autocast of the dictionaries' "
                                                                 "training (float32: none)")
    batch_blocks: JsonInt = Field(default=8, ge=1, description=f"{FROM_MODEL}: blocks per forward pass")
    buffer_tokens: JsonInt | None = Field(default=None, ge=1, description=f"{FROM_MODEL}: tokens of the mixing "
                                          "buffer that shuffles across documents (default: 262,144, at most a "
                                          "quarter of free memory and the run's tokens)")
    heldout_tokens: JsonInt | None = Field(default=None, ge=0, description=f"{FROM_MODEL}: tokens after the "
                                           "training tokens kept for held-out metrics (default: a tenth of the "
                                           "run, at most 262,144)")
    checkpoint_every: JsonInt | None = Field(default=None, ge=1, description="training tokens between resumable "
                                                                             "checkpoints (default: a tenth of "
                                                                             "the run)")
    distribute_modules: bool = Field(default=False, description=f"{FROM_MODEL}, under torchrun: each rank trains "
                                                                "its share of the dictionaries on whole batches")
    overwrite: bool = Field(default=False, description="retrain dictionaries that finished with this configuration")
    config: dict[str, Any] | None = Field(default=None, description="more settings by name: any TrainConfig or "
                                          "SAEConfig field (e.g. lr_warmup_steps, l1_coefficient) and these "
                                          "parameters' own names; the parameters given win (the CLI reads a "
                                          "TOML/JSON file)")
