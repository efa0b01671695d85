"""A tiny model, a cache of it and two random SAEs in an atlas: the shared setup of the
streamed-summary tests and their torchrun worker."""

from __future__ import annotations

from pathlib import Path

import torch

from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats.saelens import save_saelens
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout

MODEL = {"kind": "tiny", "n_layers": 3, "d_model": 16, "n_heads": 2, "d_mlp": 32, "seed": 3}
CORPUS = CorpusSpec(context_size=16)
BATCH_BLOCKS = 4
N_TOKENS = 16 * 4 * 7  # 7 batches
SAES = {"s0": "blocks.0.hook_resid_post", "s1": "blocks.1.hook_resid_post"}


def tiny() -> ModelHandle:
    return load_model(MODEL, device="cpu", dtype="float32")


def make_atlas(root: Path, *, with_cache: bool = True) -> ModelHandle:
    """An atlas with two random TopK SAEs (and a cache of the same tokens the stream reads)."""
    handle = tiny()
    if with_cache:
        cache_activations(handle, root, list(SAES.values()), corpus=CORPUS, n_tokens=N_TOKENS,
                          batch_blocks=BATCH_BLOCKS, shard_blocks=8, progress=False)
    else:
        AtlasLayout(root).update_meta(model=handle.spec)
    for i, (sae_id, hook) in enumerate(SAES.items()):
        torch.manual_seed(10 + i)
        sae = build_sae(SAEConfig("topk", d_in=16, d_sae=24, k=4, hook_name=hook, seed=i))
        with torch.no_grad():
            sae.b_enc.add_(0.3)  # many latents fire, so the top-k and bands are full
        save_saelens(sae, AtlasLayout(root).sae_dir(sae_id))
    return handle
