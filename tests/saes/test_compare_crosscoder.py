"""Crosscoders: on a pair where model B has one planted extra direction, a B-only latent
(relative decoder norm > 0.9) carries it and the shared latents sit near 0.5."""

import itertools

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.crosscoder import (
    read_crosscoder_sides,
    relative_norms,
    side_scales,
    train_crosscoder,
)
from sae_atlas.saes.train.config import TrainConfig
from tests.saes.compare_fixtures import one_thread  # noqa: F401
from tests.saes.planted import planted_atoms

D, N_SHARED, BATCH = 16, 24, 256


def paired_stream(seed: int = 0):
    """Shared latents written by different atoms into A (d=16) and B (d=24, 3x the scale),
    plus one direction only B carries, firing on a fifth of the tokens."""
    atoms_a, atoms_b = planted_atoms(D, N_SHARED, seed=1), planted_atoms(24, N_SHARED + 1, seed=2)

    def stream(skip: int):
        gen = torch.Generator().manual_seed(seed)
        for step in itertools.count():
            idx = torch.rand(BATCH, N_SHARED, generator=gen).topk(2, dim=1).indices
            codes = torch.zeros(BATCH, N_SHARED).scatter_(1, idx, 1 + torch.rand(BATCH, 2, generator=gen))
            extra = (torch.rand(BATCH, 1, generator=gen) < 0.2) * (1 + torch.rand(BATCH, 1, generator=gen))
            if step < skip:
                continue
            x_a = codes @ atoms_a
            x_b = 3.0 * (torch.cat([codes, extra], dim=1) @ atoms_b)
            yield torch.cat([x_a, x_b], dim=1)

    return stream, atoms_a, atoms_b[-1]


def test_a_planted_b_only_direction_gets_a_b_only_latent_and_shared_ones_sit_near_half(tmp_path):
    stream, atoms_a, extra_dir = paired_stream()
    cfg = TrainConfig(total_tokens=BATCH * 400, batch_size=BATCH, progress=False, seed=0,
                      checkpoint_every_tokens=0)
    result, scales = train_crosscoder(stream, D, 24, d_sae=32, k=3, train_cfg=cfg, out_dir=tmp_path / "cc",
                                      sides={"hook_a": "a", "hook_b": "b"})
    assert scales.scale_b > 2 * scales.scale_a  # B is 3x larger (and 1.5x wider)
    norms = relative_norms(result.sae, D)
    W_b = result.sae.W_dec.detach()[:, D:]
    cos_extra = (W_b @ extra_dir) / W_b.norm(dim=1).clamp_min(1e-9)
    carrier = int(cos_extra.argmax())
    assert cos_extra[carrier] > 0.9
    assert norms.relative[carrier] > 0.9 and norms.latent_class[carrier] == "b_only"
    W_a = result.sae.W_dec.detach()[:, :D]
    cos_shared = (atoms_a @ W_a.T) / W_a.norm(dim=1).clamp_min(1e-9)  # [atoms, latents]
    best, shared = cos_shared.max(dim=1)  # the latent that learned each shared atom
    assert (best > 0.8).all() and (best > 0.99).float().mean() > 0.7 and carrier not in shared.tolist()
    assert np.median(norms.relative[shared]) == pytest.approx(0.5, abs=0.1)
    assert (norms.latent_class[shared] == "shared").all()
    assert read_crosscoder_sides(tmp_path / "cc")["sides"]["hook_b"] == "b"


def test_bad_splits_are_refused():
    with pytest.raises(InvalidInputError, match="no side B"):
        side_scales([torch.ones(4, 8)], 8)


def test_paired_batches_are_fixed_size_reproducible_and_keep_every_row_once():
    from sae_atlas.saes.compare.crosscoder import paired_batches

    chunks = [torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 1000 * i for i, n in enumerate([5, 17, 3, 40])]
    first = list(paired_batches(iter(chunks), 8, seed=1, buffer_batches=2))
    again = list(paired_batches(iter(chunks), 8, seed=1, buffer_batches=2))
    assert all(b.shape == (8, 2) for b in first) and len(first) == 65 // 8
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
    rows = {tuple(r.tolist()) for b in first for r in b}
    assert len(rows) == 64 and rows <= {tuple(r.tolist()) for c in chunks for r in c}
