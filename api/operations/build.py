"""The parameter layer of `build`; its other layers: `sae_atlas.api.results.build` (typed-result),
`sae_atlas.api.services.build` (service).

The parameters of the operations that build an atlas: `cache` (activations), `summarize`
(feature tables), `index` (FAISS indexes), `build_labels` (offline labels) and `demo` (every
step) (`Atlas.<name>`, `sae-atlas <verb>`; writes, so no HTTP route)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import WHICH_SAES, Operation
from sae_atlas.store.index_params import APPROX_THRESHOLD

StoredDtype = Literal["float32", "float16", "bfloat16"]
BATCH_BLOCKS = "blocks per forward pass"


class CacheParams(Operation):
    """Cache the activations of several hooks of the atlas's model in one pass over a corpus
    (re-running resumes an interrupted run; a finished one is kept)."""

    hooks: list[str] | None = Field(default=None, description="hooks to cache (default: resid_post at `layers` "
                                                              "layers spread over the depth)")
    layers: JsonInt = Field(default=3, ge=1, description="layers spread over the depth when no hooks are given")
    tokens: JsonInt = Field(default=131_072, ge=1, description="tokens to cache per hook")
    dtype: StoredDtype = Field(default="float32", description="stored dtype")
    batch_blocks: JsonInt = Field(default=8, ge=1, description=BATCH_BLOCKS)
    shard_blocks: JsonInt = Field(default=64, ge=1, description="blocks per shard file")


class SummarizeParams(Operation):
    """Per-latent feature summaries (density, quantiles, histograms, top and band examples,
    logit effects) over held-out cached tokens, or streamed from the model (`from_model`)."""

    saes: list[SafeId] | None = Field(default=None, description=WHICH_SAES)
    tokens: JsonInt | None = Field(default=None, ge=1, description="held-out tokens per SAE (default: all); with "
                                                                   "from_model, corpus tokens to stream (required)")
    top_k: JsonInt = Field(default=20, ge=1, description="top activating examples kept per latent")
    before: JsonInt = Field(default=16, ge=0, description="context tokens before each example's centre")
    after: JsonInt = Field(default=4, ge=0, description="context tokens after each example's centre")
    seed: JsonInt = Field(default=0, description="seed of the activation-band sampling")
    force: bool = Field(default=False, description="recompute even when matching tables exist")
    with_model: bool = Field(default=True, description="logit effects (false: the model is not loaded)")
    from_model: bool = Field(default=False, description="stream `tokens` corpus tokens through the model (no "
                                                        "cache needed; resumable after a kill)")
    batch_blocks: JsonInt = Field(default=8, ge=1, description=f"with from_model: {BATCH_BLOCKS}")
    checkpoint_every: JsonInt | None = Field(default=None, ge=1, description="with from_model: batches between "
                                                                             "resumable checkpoints (default: one "
                                                                             "a minute)")


class IndexParams(Operation):
    """Index the unit decoder rows of each SAE and model-wide (indexes that verify are kept)."""

    saes: list[SafeId] | None = Field(default=None, description=WHICH_SAES)
    rebuild: bool = Field(default=False, description="rebuild even indexes that verify")
    approx_threshold: JsonInt = Field(default=APPROX_THRESHOLD, ge=1, description="rows from which an index is "
                                                                                  "approximate (IVF)")
    seed: JsonInt = Field(default=0, description="seed of IVF training and the recall sample")


class LabelsParams(Operation):
    """The offline labels of summarized SAEs, computed from their tables and stored."""

    saes: list[SafeId] | None = Field(default=None, description=WHICH_SAES)


class DemoParams(Operation):
    """The whole pipeline on the atlas's model and the builtin corpus: cache, one TopK SAE per
    layer (evaluated), summaries, indexes, circles, hierarchy, maps and what the explorer's
    pages open on; steps that finished are kept."""

    tokens: JsonInt = Field(default=65_536, ge=1024, description="tokens to cache per hook")
    train_tokens: JsonInt = Field(default=500_000, ge=4096, description="training tokens per SAE")
    layers: JsonInt = Field(default=3, ge=1, description="layers spread over the depth")
    seed: JsonInt = Field(default=0, description="seed of every random choice")
