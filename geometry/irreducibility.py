"""Irreducibility scores of a 2-D point cloud (Engels et al. 2024, "Not All Language Model
Features Are Linear").

- epsilon-mixture index `M = max_{v, c} P(|v.f + c| < eps * sqrt(E[(v.f + c)^2]))`: the
  largest share of points that some line through the plane passes close to (a mixture of a
  point mass on a line and something else scores high);
- separability index `S = min_theta I(x'_theta; y'_theta)` in bits over rotations theta in
  [0, pi/2), mutual information from a 2-D histogram with adaptive (equal-count) bins: an
  independent pair (a product of 1-D features) scores ~0 at the right rotation.

A feature is irreducible when it is neither a mixture nor separable: high `(1 - M) * S`.
"""

from __future__ import annotations

import numpy as np

from sae_atlas.errors import InvalidInputError


def _check_points(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != 2 or X.shape[0] < 4:
        raise InvalidInputError(f"expected a point cloud of shape [n >= 4, 2], got {X.shape}")
    if not np.isfinite(X).all():
        raise InvalidInputError("point cloud contains NaN or inf")
    return X


def _best_window_shares(P_NM: np.ndarray, eps: float) -> np.ndarray:
    """For each column (a projection `p = v.f`), the largest share of points with
    |p - s| < eps * sqrt(mean((p - s)^2)) over centres `s` at the data points."""
    out = np.empty(P_NM.shape[1])
    for j in range(P_NM.shape[1]):
        p = np.sort(P_NM[:, j])
        radius = eps * np.sqrt(p.var() + (p.mean() - p) ** 2)
        inside = np.searchsorted(p, p + radius, side="left") - np.searchsorted(p, p - radius, side="right")
        out[j] = inside.max() / p.size
    return out


def mixture_index(
    X_N2: np.ndarray,
    eps: float = 0.1,
    *,
    n_angles: int = 180,
    refine: int = 3,
) -> float:
    """Epsilon-mixture index of a 2-D cloud (see the module docstring), in [0, 1].

    Directions `v` are searched on a grid of `n_angles` over [0, pi), then `refine` times
    on a 10x finer grid around the best angle; for each direction every data point is
    tried as the window centre `-c`.
    """
    X = _check_points(X_N2)
    if not 0 < eps < 1:
        raise InvalidInputError(f"eps must be in (0, 1), got {eps}")

    def score(theta: np.ndarray) -> np.ndarray:
        return _best_window_shares(X @ np.stack([np.cos(theta), np.sin(theta)]), eps)

    step = np.pi / n_angles
    thetas = np.arange(n_angles) * step
    scores = score(thetas)
    best_theta, best = float(thetas[scores.argmax()]), float(scores.max())
    for _ in range(refine):
        local = best_theta + np.linspace(-step, step, 21)
        s = score(local)
        if s.max() > best:
            best_theta, best = float(local[s.argmax()]), float(s.max())
        step /= 10
    return best


def _equal_count_bins(x: np.ndarray, n_bins: int) -> np.ndarray:
    ranks = np.empty(x.size, dtype=np.int64)
    ranks[np.argsort(x, kind="stable")] = np.arange(x.size)
    return ranks * n_bins // x.size


def mutual_information_bits(x: np.ndarray, y: np.ndarray, n_bins: int = 10) -> float:
    """Plug-in mutual information (bits) of two samples from an `n_bins` x `n_bins`
    histogram with adaptive equal-count bins on each axis."""
    bx, by = _equal_count_bins(x, n_bins), _equal_count_bins(y, n_bins)
    joint = np.bincount(bx * n_bins + by, minlength=n_bins * n_bins).reshape(n_bins, n_bins)
    pxy = joint / joint.sum()
    px, py = pxy.sum(1, keepdims=True), pxy.sum(0, keepdims=True)
    nz = pxy > 0
    return float((pxy[nz] * np.log2(pxy[nz] / (px @ py)[nz])).sum())


def separability_index(X_N2: np.ndarray, n_bins: int = 10, *, n_angles: int = 90) -> float:
    """Separability index: the minimum over rotations theta in [0, pi/2) (grid of
    `n_angles`) of the mutual information in bits between the rotated coordinates."""
    X = _check_points(X_N2)
    best = np.inf
    for theta in np.arange(n_angles) * (np.pi / 2 / n_angles):
        c, s = np.cos(theta), np.sin(theta)
        xr, yr = X[:, 0] * c + X[:, 1] * s, -X[:, 0] * s + X[:, 1] * c
        best = min(best, mutual_information_bits(xr, yr, n_bins))
    return float(best)


def irreducibility(
    Z_NK: np.ndarray,
    *,
    eps: float = 0.1,
    n_bins: int = 10,
    max_points: int | None = 4000,
    seed: int = 0,
) -> dict[str, list[float] | float]:
    """Scores over the consecutive column pairs (0,1), (1,2), ... of `Z_NK` (PCA scores).

    Returns `mixture`, `separability` and `pair_score = (1 - M) * S` per pair, and `score`,
    their mean (the ranking score). At most `max_points` rows are used (seeded subsample).
    """
    Z = np.asarray(Z_NK, dtype=np.float64)
    if Z.ndim != 2 or Z.shape[1] < 2:
        raise InvalidInputError(f"need at least 2 components, got shape {Z.shape}")
    if max_points is not None and Z.shape[0] > max_points:
        Z = Z[np.random.default_rng(seed).choice(Z.shape[0], max_points, replace=False)]
    mix, sep = [], []
    for j in range(Z.shape[1] - 1):
        pair = Z[:, j : j + 2]
        mix.append(mixture_index(pair, eps))
        sep.append(separability_index(pair, n_bins))
    pair_score = [(1.0 - m) * s for m, s in zip(mix, sep, strict=True)]
    return {
        "mixture": mix,
        "separability": sep,
        "pair_score": pair_score,
        "score": float(np.mean(pair_score)),
    }
