"""Latent Scaling (Minder et al. 2025): latents that relative decoder norms all call B-only
are told apart: a truly B-only direction scores nu ~ 0, a direction both models carry whose
A-side decoder row shrank to zero scores nu_error ~ 1 (Complete Shrinkage), and a B-only
latent with an A-only twin firing on the same tokens scores nu_recon ~ 1 (Latent Decoupling)."""

import itertools

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.crosscoder import crosscoder_config, relative_norms, train_crosscoder
from sae_atlas.saes.compare.latent_scaling import latent_scaling, own_sides
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.train.config import TrainConfig
from tests.saes.compare_fixtures import one_thread  # noqa: F401
from tests.saes.planted import planted_atoms

D, N_SHARED, BATCH = 16, 24, 256


def _codes(gen: torch.Generator, n: int, n_latents: int, rate: float) -> torch.Tensor:
    """Sparse non-negative activations: each fires on a `rate` share of the tokens."""
    return (torch.rand(n, n_latents, generator=gen) < rate) * torch.randn(n, n_latents, generator=gen).exp()


def hand_built_pair(n: int = 4000, seed: int = 0):
    """A hand-set crosscoder over `[x_A (4), x_B (4)]` and rows it reads exactly (plus noise).
    Latent 0: e0 only in B. Latent 1: e1 in both, A-side decoder row zero (shrunk). Latents
    2 and 3: e2 in both, latent 2 decodes it into B only, latent 3 into A only (decoupled)."""
    gen = torch.Generator().manual_seed(seed)
    f = _codes(gen, n, 3, 0.3)  # the true activations of e0, e1, e2
    zero = torch.zeros(n, 1)
    x_a = torch.cat([zero, f[:, 1:2], f[:, 2:3], zero], dim=1)
    x_b = torch.cat([f, zero], dim=1)
    rows = torch.cat([x_a, x_b], dim=1) + 0.01 * torch.randn(n, 8, generator=gen)
    sae = build_sae(crosscoder_config(4, 4, d_sae=4, k=2)).eval()
    W_dec = torch.zeros(4, 8)
    W_dec[0, 4], W_dec[1, 5], W_dec[2, 6], W_dec[3, 2] = 1.0, 1.0, 1.0, 1.0
    with torch.no_grad():
        sae.W_dec.copy_(W_dec)
        sae.W_enc.copy_(W_dec.T)  # each latent reads its own coordinate
        sae.b_enc.zero_()
        sae.b_dec.zero_()
        sae.threshold.zero_()
    return sae, rows


def test_latent_scaling_separates_real_b_only_latents_from_sparsity_artefacts():
    sae, rows = hand_built_pair()
    classes = relative_norms(sae, 4).latent_class
    assert classes.tolist() == ["b_only", "b_only", "b_only", "a_only"]  # relative norms cannot tell them apart
    s = latent_scaling(sae, 4, rows.split(500), np.arange(4), own_sides(relative_norms(sae, 4).relative))
    assert s.nu_error[0] == pytest.approx(0, abs=0.05) and s.nu_recon[0] == pytest.approx(0, abs=0.05)
    assert s.nu_error[1] == pytest.approx(1, abs=0.05) and s.nu_recon[1] == pytest.approx(0, abs=0.05)
    for decoupled in (2, 3):  # B-only latent 2 and its A-only twin 3, each from its own side
        assert s.nu_recon[decoupled] == pytest.approx(1, abs=0.05)
        assert s.nu_error[decoupled] == pytest.approx(0, abs=0.05)
    assert s.beta_error_b[0] == pytest.approx(1, abs=0.05) and (s.active_tokens > 0.2 * len(rows)).all()
    cols = s.columns(6)
    assert np.isnan(cols["nu_error"][4:]).all() and (cols["scaling_active_tokens"][4:] == 0).all()


def test_betas_are_the_least_squares_fit_whatever_the_batching():
    sae, rows = hand_built_pair(n=1200, seed=3)
    one = latent_scaling(sae, 4, [rows], np.array([0, 1]), np.array(["b", "b"]))
    many = latent_scaling(sae, 4, rows.split(7), np.array([0, 1]), np.array(["b", "b"]))
    np.testing.assert_allclose(one.beta_error_a, many.beta_error_a, rtol=1e-9)
    np.testing.assert_allclose(one.beta_recon_b, many.beta_recon_b, rtol=1e-9)
    f = sae.encode(rows)[:, 1].double()
    d = sae.W_dec[1, 4:].double()
    target = (rows[:, :4].double() - sae.decode(sae.encode(rows))[:, :4].double()) + f[:, None] * sae.W_dec[1, :4]
    design = (f[:, None] * d[None, :]).reshape(-1, 1)  # beta * f d, flattened over tokens and dims
    beta = torch.linalg.lstsq(design, target.reshape(-1, 1)).solution.item()
    assert one.beta_error_a[1] == pytest.approx(beta, rel=1e-6)


def test_two_spaces_of_different_width_are_refused():
    sae = build_sae(crosscoder_config(4, 6, d_sae=3, k=1))
    with pytest.raises(InvalidInputError, match="d_a == d_b"):
        latent_scaling(sae, 4, [], np.array([0]), np.array(["b"]))


def same_space_stream(extra_dir: torch.Tensor, seed: int = 0):
    """Both models carry the shared atoms in one space (B 1.5x larger); B alone adds
    `extra_dir` on a fifth of the tokens."""
    atoms = planted_atoms(D, N_SHARED, seed=1)

    def stream(skip: int):
        gen = torch.Generator().manual_seed(seed)
        for step in itertools.count():
            idx = torch.rand(BATCH, N_SHARED, generator=gen).topk(2, dim=1).indices
            codes = torch.zeros(BATCH, N_SHARED).scatter_(1, idx, 1 + torch.rand(BATCH, 2, generator=gen))
            extra = (torch.rand(BATCH, 1, generator=gen) < 0.2) * (1 + torch.rand(BATCH, 1, generator=gen))
            if step < skip:
                continue
            x_a = codes @ atoms
            yield torch.cat([x_a, 1.5 * (x_a + extra * extra_dir)], dim=1)

    return stream, atoms


def test_a_trained_crosscoder_keeps_its_planted_b_only_latent_and_flags_a_shrunk_shared_one(tmp_path):
    extra_dir = planted_atoms(D, 1, seed=7)[0]
    stream, atoms = same_space_stream(extra_dir)
    cfg = TrainConfig(total_tokens=BATCH * 400, batch_size=BATCH, progress=False, seed=0, checkpoint_every_tokens=0)
    result, scales = train_crosscoder(stream, D, D, d_sae=32, k=3, train_cfg=cfg)
    sae = result.sae
    W_b = sae.W_dec.detach()[:, D:]
    carrier = int(((W_b @ extra_dir) / W_b.norm(dim=1).clamp_min(1e-9)).argmax())
    assert relative_norms(sae, D).latent_class[carrier] == "b_only"
    W_a = sae.W_dec.detach()[:, :D]
    shared = int(((W_a @ atoms[0]) / W_a.norm(dim=1).clamp_min(1e-9)).argmax())
    assert relative_norms(sae, D).latent_class[shared] == "shared"
    with torch.no_grad():
        sae.W_dec[shared, :D] = 0  # Complete Shrinkage: the A-side row of a shared latent gone
    assert relative_norms(sae, D).latent_class[shared] == "b_only"
    held_out = (scales.apply(rows) for rows in itertools.islice(stream(1000), 20))
    s = latent_scaling(sae, D, held_out, np.array([carrier, shared]), np.array(["b", "b"]))
    assert abs(s.nu_error[0]) < 0.2 and abs(s.nu_recon[0]) < 0.3  # truly B-only (shared ones: ~0.9)
    assert s.nu_error[1] > 0.7  # present in A: it sits in A's reconstruction error
