"""Streamed and cached training recover the same planted dictionary.

The plant: a tiny model whose token embeddings are random atoms (scaled to norm 3), so
`blocks.0.hook_resid_pre` holds exactly one atom per token, a 1-sparse dictionary. A TopK
SAE with k=1 trained on it represents token t as `b_dec + a * W_dec[i]`, so its row for t
points along `atom_t - b_dec`. The same config is trained from a cache of the tokens and
from the model's stream; each must recover the atoms of the tokens seen at least 100 times
(mean max cosine >= 0.95 with its own centre), and the two dictionaries' latents that code
them must match each other (mean max cosine >= 0.95 both ways).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.saes.train_from_model import StreamOptions, train_from_model
from tests.saes.planted import one_thread, planted_atoms, recovery  # noqa: F401

HOOK = "blocks.0.hook_resid_pre"
CORPUS = CorpusSpec(context_size=32)
BLOCKS = 1200
TRAIN = TrainConfig(total_tokens=256 * 120, batch_size=256, b_dec_init="zero", progress=False)


def _unit(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.norm(dim=-1, keepdim=True)


def _coding_rows(sae: SAE, atoms: torch.Tensor) -> torch.Tensor:
    """The distinct decoder rows that best match the planted atoms."""
    W = _unit(sae.W_dec.detach())
    return W[(atoms @ W.T).argmax(1).unique()]


def test_streamed_and_cached_training_recover_the_same_planted_dictionary(tmp_path: Path) -> None:
    handle = tiny_model(n_layers=1, d_model=32, n_heads=2, d_mlp=32, seed=4)
    atoms = planted_atoms(32, handle.d_vocab, seed=3) * 3
    with torch.no_grad():
        handle.bridge.W_E.copy_(atoms)
    counts = Counter(t for b in iter_blocks(handle.tokenizer, CORPUS, max_blocks=BLOCKS, batch_blocks=64)
                     for t in b.token_ids.flatten().tolist())
    special = {handle.tokenizer.bos_token_id, handle.tokenizer.eos_token_id, handle.tokenizer.pad_token_id}
    common = [t for t, n in counts.items() if n >= 100 and t not in special]
    assert len(common) >= 25
    planted = atoms[common]

    cache_activations(handle, tmp_path / "cached", [HOOK], corpus=CORPUS, n_tokens=32 * BLOCKS, batch_blocks=64,
                      progress=False)
    train_saes(tmp_path / "cached", [HOOK], d_sae=128, k=1, train_cfg=TRAIN)
    train_from_model(handle, tmp_path / "stream", [HOOK], d_sae=128, k=1, train_cfg=TRAIN,
                     stream=StreamOptions(CORPUS, batch_blocks=64, buffer_tokens=8192, heldout_tokens=256))
    saes = [load_atlas_sae(tmp_path / name, f"{HOOK}-topk-128") for name in ("cached", "stream")]

    for sae in saes:  # each recovers the atoms, seen from its own centre
        assert recovery(sae.W_dec.detach(), _unit(planted - sae.b_dec.detach())) >= 0.95
    cached, streamed = (_coding_rows(sae, _unit(planted)) for sae in saes)
    assert recovery(cached, streamed) >= 0.95 and recovery(streamed, cached) >= 0.95
