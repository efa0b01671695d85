"""Planted SAEs and paired activations for the comparison tests."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from sae_atlas.geometry.similarity import random_rotation
from sae_atlas.saes.compare.pairs import PairedActs
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAE, SAEConfig
from tests.saes.planted import planted_atoms, planted_batches


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Torch and BLAS single-threaded for the module (import it to use it): small matrices
    on a loaded machine are many times slower with a second thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(before)


def planted_sae(atoms_FD: torch.Tensor, k: int = 3) -> SAE:
    """A TopK SAE whose encoder and decoder are the planted atoms (it reads planted data)."""
    F, D = atoms_FD.shape
    sae = build_sae(SAEConfig(architecture="topk", d_in=D, d_sae=F, k=k)).eval()
    with torch.no_grad():
        sae.W_dec.copy_(atoms_FD)
        sae.W_enc.copy_(atoms_FD.T)
        sae.b_enc.zero_()
        sae.b_dec.copy_(torch.full((D,), 2.0 / D**0.5))  # the planted offset
    return sae


def rotated_permuted_copy(sae: SAE, R_DD: torch.Tensor, perm_F: torch.Tensor) -> SAE:
    """The same SAE with latents permuted and the space rotated by `R` (it reads `x @ R`)."""
    copy = build_sae(sae.cfg).eval()
    with torch.no_grad():
        copy.W_enc.copy_(R_DD.T @ sae.W_enc[:, perm_F])
        copy.b_enc.copy_(sae.b_enc[perm_F])
        copy.W_dec.copy_(sae.W_dec[perm_F] @ R_DD)
        copy.b_dec.copy_(sae.b_dec @ R_DD)
    return copy


def rotation(d: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(random_rotation(d, np.random.default_rng(seed))).float()


def planted_pairs(atoms_FD: torch.Tensor, R_DD: torch.Tensor | None, *, batch: int = 256, n_batches: int = 8,
                  seed: int = 0) -> Iterator[PairedActs]:
    """Planted activations paired with their rotation by `R` (or with independent planted data)."""
    other = planted_batches(atoms_FD, batch, n_batches, seed=seed + 100)
    for x in planted_batches(atoms_FD, batch, n_batches, seed=seed):
        yield PairedActs(x, x @ R_DD if R_DD is not None else next(other))


__all__ = ["one_thread", "planted_atoms", "planted_pairs", "planted_sae", "rotated_permuted_copy", "rotation"]
