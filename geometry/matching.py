"""Matching two dictionaries of directions: Hungarian-matched mean cosine (MCC) and atom
recovery.

Given learned unit directions `A [F, d]` and ground-truth atoms `B [G, d]`, the cosine
matrix `C = A_hat @ B_hat^T` is matched one-to-one by the Hungarian algorithm
(`scipy.optimize.linear_sum_assignment`, maximising the summed cosine); the mean
correlation coefficient `mcc` is the mean cosine over the `min(F, G)` matched pairs (the
identifiability score of ICA / sparse dictionary learning, used for SAEs on planted data
by e.g. Sharkey et al. 2022, "Taking features out of superposition with sparse
autoencoders"). Atom recovery is the mean over true atoms of the best cosine with any
learned direction, and the share of atoms whose best cosine exceeds a threshold. Cosines
are signed: a direction pointing the other way does not recover an atom. `mcc_chance` is
the MCC of a seeded random Gaussian dictionary of the learned one's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from store.errors import InvalidInputError

RECOVERY_THRESHOLD = 0.9
CHANCE_STREAM = 0x3CC  # keeps the chance dictionary's draws apart from other seeded arrays


@dataclass(frozen=True)
class DictionaryMatch:
    """How well learned directions match ground-truth atoms."""

    mcc: float
    mcc_chance: float
    mean_best_cosine: float
    frac_recovered: float  # share of true atoms with best cosine > threshold
    matched_latent: np.ndarray  # [G] the latent matched to each atom (-1 when unmatched)
    matched_cosine: np.ndarray  # [G] its cosine (nan when unmatched)


def unit_rows(W_ND: np.ndarray, what: str) -> np.ndarray:
    """Rows scaled to unit norm (InvalidInputError for a non-2-D array or a zero row)."""
    W = np.asarray(W_ND, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] == 0:
        raise InvalidInputError(f"{what} must be a non-empty [n, d] array, got shape {W.shape}")
    norms = np.linalg.norm(W, axis=1, keepdims=True)
    if (norms == 0).any():
        raise InvalidInputError(f"{what} has {int((norms == 0).sum())} zero rows; directions need a norm")
    return W / norms


def hungarian_mcc(cos_FG: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """`(mcc, rows, cols)`: the one-to-one matching maximising the summed cosine, its mean."""
    rows, cols = linear_sum_assignment(cos_FG, maximize=True)
    return float(cos_FG[rows, cols].mean()), rows, cols


def match_dictionaries(learned_FD: np.ndarray, atoms_GD: np.ndarray, *, threshold: float = RECOVERY_THRESHOLD,
                       seed: int = 0) -> DictionaryMatch:
    """MCC, its chance level and atom recovery of learned directions against true atoms."""
    A, B = unit_rows(learned_FD, "the learned dictionary"), unit_rows(atoms_GD, "the ground-truth dictionary")
    if A.shape[1] != B.shape[1]:
        raise InvalidInputError(f"the dictionaries live in different spaces: d={A.shape[1]} vs d={B.shape[1]}")
    cos = A @ B.T
    mcc, rows, cols = hungarian_mcc(cos)
    random = unit_rows(np.random.default_rng((CHANCE_STREAM, seed)).standard_normal(A.shape), "the random dictionary")
    chance, _, _ = hungarian_mcc(random @ B.T)
    best = cos.max(axis=0)
    matched_latent = np.full(B.shape[0], -1, dtype=np.int64)
    matched_cosine = np.full(B.shape[0], np.nan)
    matched_latent[cols] = rows
    matched_cosine[cols] = cos[rows, cols]
    return DictionaryMatch(mcc, chance, float(best.mean()), float((best > threshold).mean()),
                           matched_latent, matched_cosine)
