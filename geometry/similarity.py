"""Similarity of two representation spaces, each score beside a null.

- `pearson_from_sums`: the Pearson correlation of every latent pair from running sums (the
  statistics `saes.compare.correlation` streams over tokens).
- `svcca` (Raghu et al. 2017, "SVCCA: Singular Vector Canonical Correlation Analysis"):
  each side's columns centred and cut to the top singular directions that explain `keep`
  of its variance, then the mean canonical correlation of the two reduced spaces. Invariant
  to any invertible linear map of either side's columns, so a rotated copy scores 1.
- `rsa` (Kriegeskorte et al. 2008; used on matched SAE features by Lan et al. 2024, "Sparse
  autoencoders reveal universal feature spaces across large language models"): the
  Spearman correlation of the upper triangles of the two sides' row-by-row cosine matrices.

The rows of `X` and `Y` are paired (matched features, or the same tokens). `null_test`
scores the pair, then `n_perm` null draws, and reports the permutation p-value
`(1 + #{null >= score}) / (1 + n_perm)` (Phipson & Smyth 2010). The nulls: `shuffled_rows`
(pairing broken: shuffled tokens for activation spaces), `random_rows` (unmatched random
features of the same count) and `random_rotation` (a Haar-random orthogonal matrix).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy.stats import rankdata

from sae_atlas.errors import InvalidInputError

SpaceScore = Literal["svcca", "rsa"]
SPACE_SCORES: tuple[str, ...] = ("svcca", "rsa")
NullDraw = Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class NullScore:
    """A score beside its null distribution."""

    score: float
    null_mean: float
    null_std: float
    p_value: float  # (1 + #{null >= score}) / (1 + n_null)
    n_null: int
    null: str  # what the null draws were

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pearson_from_sums(n: float, sum_a_F: np.ndarray, sum_b_G: np.ndarray, sq_a_F: np.ndarray, sq_b_G: np.ndarray,
                      cross_FG: np.ndarray) -> np.ndarray:
    """Pearson correlation `[F, G]` of every pair of latents from `n` tokens' sums `sum x`,
    `sum x^2` of each side and `sum x_a x_b` of each pair; a latent that is constant over
    the tokens (dead) correlates 0 with everything."""
    if n < 2:
        raise InvalidInputError(f"correlations need at least 2 tokens, got {n}")
    mean_a, mean_b = sum_a_F / n, sum_b_G / n
    var_a = np.maximum(sq_a_F / n - mean_a**2, 0.0)
    var_b = np.maximum(sq_b_G / n - mean_b**2, 0.0)
    cov = cross_FG / n - np.outer(mean_a, mean_b)
    denom = np.sqrt(np.outer(var_a, var_b))
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(denom > 0, cov / np.where(denom > 0, denom, 1.0), 0.0)
    return np.clip(corr, -1.0, 1.0)


def _checked_pair(X_NP: np.ndarray, Y_NQ: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    X, Y = np.asarray(X_NP, dtype=np.float64), np.asarray(Y_NQ, dtype=np.float64)
    if X.ndim != 2 or Y.ndim != 2 or len(X) != len(Y):
        raise InvalidInputError(f"{what} needs two [n, d] arrays with paired rows, got shapes {X.shape} and {Y.shape}")
    if len(X) < 3:
        raise InvalidInputError(f"{what} needs at least 3 paired rows, got {len(X)}")
    return X, Y


def _top_directions(X_NP: np.ndarray, keep: float) -> np.ndarray:
    """Orthonormal `[N, r]` basis of the centred columns' top singular directions that
    explain `keep` of the variance (empty when the columns are constant)."""
    U, s, _ = np.linalg.svd(X_NP - X_NP.mean(axis=0), full_matrices=False)
    var = s**2
    if var.sum() <= 1e-12 * max(1.0, float(np.abs(X_NP).max()) ** 2):
        return U[:, :0]
    r = int(np.searchsorted(np.cumsum(var) / var.sum(), keep - 1e-12) + 1)
    return U[:, : min(r, int((s > s[0] * 1e-10).sum()))]


def canonical_correlations(X_NP: np.ndarray, Y_NQ: np.ndarray, *, keep: float = 0.99) -> np.ndarray:
    """The canonical correlations (descending) of the two reduced spaces (SVCCA's first step
    then CCA: the singular values of `Ux^T Uy` for orthonormal bases of both)."""
    X, Y = _checked_pair(X_NP, Y_NQ, "SVCCA")
    if not 0 < keep <= 1:
        raise InvalidInputError(f"keep must be in (0, 1], got {keep}")
    Ux, Uy = _top_directions(X, keep), _top_directions(Y, keep)
    if Ux.shape[1] == 0 or Uy.shape[1] == 0:
        return np.zeros(0)
    return np.clip(np.linalg.svd(Ux.T @ Uy, compute_uv=False), 0.0, 1.0)


def svcca(X_NP: np.ndarray, Y_NQ: np.ndarray, *, keep: float = 0.99) -> float:
    """Mean canonical correlation of the two reduced spaces (0 when either is constant)."""
    rho = canonical_correlations(X_NP, Y_NQ, keep=keep)
    return float(rho.mean()) if len(rho) else 0.0


def _cosine_upper(X_NP: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(X_NP, axis=1, keepdims=True)
    U = X_NP / np.where(norms > 0, norms, 1.0)
    return (U @ U.T)[np.triu_indices(len(U), k=1)]


def rsa(X_NP: np.ndarray, Y_NQ: np.ndarray) -> float:
    """Spearman correlation of the two sides' row-by-row cosine similarities (upper
    triangles); 0 when either side's similarities are all equal."""
    X, Y = _checked_pair(X_NP, Y_NQ, "RSA")
    a, b = rankdata(_cosine_upper(X)), rankdata(_cosine_upper(Y))
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt((a**2).sum() * (b**2).sum())
    return float((a * b).sum() / denom) if denom > 0 else 0.0


def space_score(name: SpaceScore, X_NP: np.ndarray, Y_NQ: np.ndarray) -> float:
    """`svcca` or `rsa` of two paired spaces."""
    if name == "svcca":
        return svcca(X_NP, Y_NQ)
    if name == "rsa":
        return rsa(X_NP, Y_NQ)
    raise InvalidInputError(f"unknown space score {name!r}; valid: {', '.join(SPACE_SCORES)}")


def random_rotation(d: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-random `[d, d]` orthogonal matrix (QR of a Gaussian, signs fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def shuffled_rows(X_NP: np.ndarray, Y_NQ: np.ndarray) -> NullDraw:
    """Null draws with `Y`'s rows shuffled against `X`'s (the pairing broken)."""
    return lambda rng: (X_NP, Y_NQ[rng.permutation(len(Y_NQ))])


def random_rows(X_NP: np.ndarray, pool_MQ: np.ndarray) -> NullDraw:
    """Null draws pairing `X` with as many random rows of `pool` (unmatched random features)."""
    if len(pool_MQ) < len(X_NP):
        raise InvalidInputError(f"the random-feature null needs at least {len(X_NP)} rows to draw from, "
                                f"got {len(pool_MQ)}")
    return lambda rng: (X_NP, pool_MQ[rng.choice(len(pool_MQ), size=len(X_NP), replace=False)])


def permutation_p(score: float, null: np.ndarray) -> float:
    """`(1 + #{null >= score}) / (1 + len(null))`."""
    return float((1 + int((np.asarray(null) >= score - 1e-12).sum())) / (1 + len(null)))


def null_test(score_fn: Callable[[np.ndarray, np.ndarray], float], X_NP: np.ndarray, Y_NQ: np.ndarray,
              draw: NullDraw, *, null: str, n_perm: int = 100, seed: int = 0) -> NullScore:
    """`score_fn(X, Y)` beside `n_perm` seeded null draws of `draw` and its p-value."""
    if n_perm < 1:
        raise InvalidInputError(f"n_perm must be at least 1, got {n_perm}")
    score = score_fn(X_NP, Y_NQ)
    rng = np.random.default_rng(seed)
    values = np.array([score_fn(*draw(rng)) for _ in range(n_perm)])
    return NullScore(float(score), float(values.mean()), float(values.std()), permutation_p(score, values), n_perm,
                     null)
