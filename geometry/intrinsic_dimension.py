"""Intrinsic dimension of a point cloud (the one home of these estimators; the galaxy view
and the depth analysis both use them).

- `twonn_dimension`: TwoNN (Facco et al. 2017, "Estimating the intrinsic dimension of
  datasets by a minimal neighborhood information").
- `mle_dimension`: the Levina-Bickel k-NN maximum-likelihood estimate (2004), pooled over
  points as MacKay and Ghahramani suggest (average the per-point inverse estimates, then
  invert), on a seeded subsample, with a seeded bootstrap interval over points.
- `local_dimension`: the same MLE restricted to each point's own k neighbours (local
  intrinsic dimension, LID), in its unbiased `(k - 2)` form.

Neighbours come from an exact FAISS L2 search. Exact duplicate rows (BOS states, repeated
text) make neighbour distances 0 and are dropped before any estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from sae_atlas.errors import InvalidInputError


def _checked_cloud(X_ND: np.ndarray, what: str, min_rows: int) -> np.ndarray:
    X = np.asarray(X_ND)
    if X.ndim != 2 or X.shape[0] < min_rows:
        raise InvalidInputError(f"{what} needs a 2-D array with >= {min_rows} rows, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise InvalidInputError(f"{what} got non-finite values (NaN or inf)")
    return np.ascontiguousarray(X, dtype=np.float32)


def _subsample(X_ND: np.ndarray, max_points: int, seed: int) -> np.ndarray:
    if len(X_ND) <= max_points:
        return X_ND
    return X_ND[np.sort(np.random.default_rng(seed).choice(len(X_ND), max_points, replace=False))]


def neighbour_distances(X_ND: np.ndarray, k: int) -> np.ndarray:
    """Distances `[N, k]` from each row to its `k` nearest other rows (ascending; exact
    FAISS L2 search, the row itself left out)."""
    X = np.ascontiguousarray(X_ND, dtype=np.float32)
    index = faiss.IndexFlatL2(X.shape[1])
    index.add(X)
    dist2, _ = index.search(X, k + 1)
    return np.sqrt(np.maximum(dist2[:, 1:].astype(np.float64), 0.0))


@dataclass
class TwoNN:
    """TwoNN intrinsic dimension and the points it used."""

    dimension: float
    n_points: int
    n_used: int  # after dropping duplicates and the discarded tail
    low: float | None = None  # bootstrap interval over points (None without resamples)
    high: float | None = None
    confidence: float | None = None


def _twonn_slope(mu_sorted: np.ndarray, keep: int) -> float:
    """The TwoNN fit through the origin of `-log(1 - F(mu))` on `log mu`, over the `keep`
    smallest of the sorted ratios."""
    F = np.arange(1, len(mu_sorted) + 1) / len(mu_sorted)
    x, y = np.log(mu_sorted[:keep]), -np.log(1 - F[:keep])
    return float((x @ y) / max(float(x @ x), 1e-300))


def twonn_dimension(
    X_ND: np.ndarray, *, discard_fraction: float = 0.1, max_points: int = 20000, seed: int = 0,
    n_boot: int = 0, confidence: float = 0.9,
) -> TwoNN:
    """TwoNN: with `mu = r2 / r1` (second over first neighbour distance), the empirical
    `-log(1 - F(mu))` is linear in `log mu` with slope equal to the dimension; fit through
    the origin after discarding the largest `discard_fraction` of mu. At most
    `max_points` rows (a seeded subsample) are used. With `n_boot` > 0, a `confidence`
    bootstrap interval: the points' ratios resampled with replacement and refitted."""
    X = _subsample(_checked_cloud(X_ND, "TwoNN", 10), max_points, seed)
    d = neighbour_distances(X, 2)
    # a point with a duplicate has r1 = 0 and is dropped
    r1, r2 = d[:, 0], d[:, 1]
    ok = r1 > 0
    mu = np.sort(r2[ok] / r1[ok])
    n = len(mu)
    keep = int(np.floor(n * (1 - discard_fraction)))
    if keep < 5:
        raise InvalidInputError("too few distinct points for TwoNN")
    result = TwoNN(_twonn_slope(mu, keep), int(X_ND.shape[0]), keep)
    if n_boot > 0:
        draws = np.sort(mu[np.random.default_rng(seed + 1).integers(0, n, size=(n_boot, n))], axis=1)
        boots = [_twonn_slope(draw, keep) for draw in draws]
        tail = (1.0 - confidence) / 2
        result.low, result.high = (float(v) for v in np.quantile(boots, [tail, 1.0 - tail]))
        result.confidence = confidence
    return result


def _distinct(X_ND: np.ndarray) -> np.ndarray:
    return np.unique(X_ND, axis=0)


def _check_k(n: int, k: int, what: str) -> None:
    if k < 3:
        raise InvalidInputError(f"{what} needs k >= 3 neighbours, got k={k}")
    if n <= k:
        raise InvalidInputError(f"{what} with k={k} needs more than {k} distinct points, got {n}; "
                                f"lower k or give more tokens")


def _inverse_estimates(dist_NK: np.ndarray) -> np.ndarray:
    """Per point, `mean_j log(T_k / T_j)` over its `k - 1` nearer neighbours: an unbiased
    estimate of `1 / dimension` given `T_k`."""
    T = dist_NK
    return np.log(T[:, -1:] / T[:, :-1]).mean(axis=1)


@dataclass
class MLEDimension:
    """Levina-Bickel intrinsic dimension with its bootstrap interval."""

    dimension: float
    low: float  # bootstrap interval over points
    high: float
    k: int
    n_points: int  # rows given
    n_used: int  # distinct rows of the subsample
    confidence: float


def mle_dimension(
    X_ND: np.ndarray, *, k: int = 10, max_points: int = 20000, n_boot: int = 200,
    confidence: float = 0.9, seed: int = 0,
) -> MLEDimension:
    """Levina-Bickel MLE over `k` neighbours: the inverse of the mean over points of
    `mean_j log(T_k / T_j)` (MacKay-Ghahramani pooling), on at most `max_points` distinct
    rows (seeded subsample), with a `confidence` bootstrap interval from `n_boot` seeded
    resamples of the points' inverse estimates."""
    X = _distinct(_subsample(_checked_cloud(X_ND, "MLE dimension", 2), max_points, seed))
    _check_k(len(X), k, "MLE dimension")
    inv_N = _inverse_estimates(neighbour_distances(X, k))
    rng = np.random.default_rng(seed + 1)
    boots = 1.0 / inv_N[rng.integers(0, len(inv_N), size=(n_boot, len(inv_N)))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(boots, [tail, 1.0 - tail])
    return MLEDimension(float(1.0 / inv_N.mean()), float(low), float(high), k, int(X_ND.shape[0]), len(X),
                        confidence)


def inverse_estimates(X_ND: np.ndarray, *, k: int, what: str = "MLE dimension") -> np.ndarray:
    """Per row `[N]`, `mean_j log(T_k / T_j)` over its `k` nearest distinct neighbours: the
    Levina-Bickel estimate of `1 / dimension` around it (the MLE pools `1 / mean` of these;
    duplicate rows share the value of their distinct row)."""
    X = _checked_cloud(X_ND, what, 2)
    distinct, inverse = np.unique(X, axis=0, return_inverse=True)
    _check_k(len(distinct), k, what)
    return _inverse_estimates(neighbour_distances(distinct, k))[np.asarray(inverse).reshape(-1)]


def local_dimension(X_ND: np.ndarray, *, k: int = 20) -> np.ndarray:
    """Local intrinsic dimension `[N]` of every row: `(k - 2) / sum_j log(T_k / T_j)` over
    its own `k` nearest distinct neighbours (the unbiased Levina-Bickel form). Duplicate
    rows share the value of their distinct row."""
    inv = inverse_estimates(X_ND, k=k, what="local dimension")
    return (k - 2) / np.maximum((k - 1) * inv, 1e-12)
