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

`match_features` matches two learned dictionaries by any similarity matrix (activation
correlation or decoder cosine): the Hungarian one-to-one matching, mutual nearest
neighbours and the mean max similarity of each side (Lan et al. 2024, "Sparse autoencoders
reveal universal feature spaces across large language models"; Paulo & Belrose 2025,
"Sparse autoencoders trained on the same data learn different features").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.vectors import unit_rows

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


def hungarian_mcc(cos_FG: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """`(mcc, rows, cols)`: the one-to-one matching maximising the summed cosine, its mean."""
    rows, cols = linear_sum_assignment(cos_FG, maximize=True)
    return float(cos_FG[rows, cols].mean()), rows, cols


def match_dictionaries(learned_FD: np.ndarray, atoms_GD: np.ndarray, *, threshold: float = RECOVERY_THRESHOLD,
                       seed: int = 0) -> DictionaryMatch:
    """MCC, its chance level and atom recovery of learned directions against true atoms."""
    A = unit_rows(learned_FD, np.float64, zero_rows="refuse", what="the learned dictionary")
    B = unit_rows(atoms_GD, np.float64, zero_rows="refuse", what="the ground-truth dictionary")
    if A.shape[1] != B.shape[1]:
        raise InvalidInputError(f"the dictionaries live in different spaces: d={A.shape[1]} vs d={B.shape[1]}")
    cos = A @ B.T
    mcc, rows, cols = hungarian_mcc(cos)
    random = unit_rows(np.random.default_rng((CHANCE_STREAM, seed)).standard_normal(A.shape), np.float64)
    chance, _, _ = hungarian_mcc(random @ B.T)
    best = cos.max(axis=0)
    matched_latent = np.full(B.shape[0], -1, dtype=np.int64)
    matched_cosine = np.full(B.shape[0], np.nan)
    matched_latent[cols] = rows
    matched_cosine[cols] = cos[rows, cols]
    return DictionaryMatch(mcc, chance, float(best.mean()), float((best > threshold).mean()),
                           matched_latent, matched_cosine)


@dataclass(frozen=True)
class FeatureMatch:
    """Two dictionaries matched by a similarity matrix `[F, G]` (rows A, columns B)."""

    mcc: float  # mean similarity over the min(F, G) Hungarian pairs
    mean_max_a: float  # mean over A's latents of the best similarity with any B latent
    mean_max_b: float  # mean over B's latents of the best similarity with any A latent
    pairs_a: np.ndarray  # [P] A latents of the Hungarian pairs
    pairs_b: np.ndarray  # [P] their B latents
    pair_similarity: np.ndarray  # [P] the pairs' similarities
    mutual_a: np.ndarray  # [M] A latents that are their B partner's nearest neighbour and back
    mutual_b: np.ndarray  # [M] the partners


def mutual_nearest(sim_FG: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(rows, cols)`: the pairs each of which is the other's most similar (ties: first)."""
    best_b = sim_FG.argmax(axis=1)
    best_a = sim_FG.argmax(axis=0)
    rows = np.flatnonzero(best_a[best_b] == np.arange(sim_FG.shape[0]))
    return rows, best_b[rows]


def match_features(sim_FG: np.ndarray) -> FeatureMatch:
    """Hungarian matching, mutual nearest neighbours and mean max similarity of a finite
    similarity matrix (InvalidInputError for an empty or non-finite one)."""
    sim = np.asarray(sim_FG, dtype=np.float64)
    if sim.ndim != 2 or 0 in sim.shape:
        raise InvalidInputError(f"the similarity matrix must be a non-empty [F, G] array, got shape {sim.shape}")
    if not np.isfinite(sim).all():
        raise InvalidInputError("the similarity matrix has non-finite entries")
    mcc, rows, cols = hungarian_mcc(sim)
    mutual_a, mutual_b = mutual_nearest(sim)
    return FeatureMatch(mcc, float(sim.max(axis=1).mean()), float(sim.max(axis=0).mean()),
                        rows, cols, sim[rows, cols], mutual_a, mutual_b)
