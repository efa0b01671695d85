"""Galaxy-scale shape of a dictionary (Li, Michaud, Tegmark et al. 2024, "The Geometry of
Concepts"): the eigenvalue spectrum of the decoder-row covariance follows a power law
whose slope, fitted on log-eigenvalue vs log-rank over ranks 10-150, is steepest in the
middle layers; and the intrinsic dimension of a point cloud by TwoNN (Facco et al.
2017, "Estimating the intrinsic dimension of datasets by a minimal neighborhood
information"), with neighbours from an exact FAISS L2 search.
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from store.errors import InvalidInputError
from store.vectors import unit_rows


def covariance_spectrum(X_ND: np.ndarray, *, unit: bool = False) -> np.ndarray:
    """Eigenvalues (descending) of the covariance of the rows of `X_ND` (decoder rows;
    `unit=True` normalises them first)."""
    X = np.asarray(X_ND, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise InvalidInputError(f"need a 2-D array with >= 2 rows, got shape {X.shape}")
    if unit:
        X = unit_rows(X, np.float64)
    Xc = X - X.mean(axis=0)
    cov = Xc.T @ Xc / (X.shape[0] - 1)
    return np.clip(np.linalg.eigvalsh(cov)[::-1], 0.0, None)


@dataclass
class PowerLaw:
    """Fit `log lambda_r = intercept + slope * log r` over ranks `lo..hi` (1-based);
    `alpha = -slope` is the decay exponent the papers report."""

    slope: float
    intercept: float
    alpha: float
    r2: float
    lo: int
    hi: int


def power_law_fit(eigenvalues: np.ndarray, ranks: tuple[int, int] = (10, 150)) -> PowerLaw:
    """Least-squares line through (log rank, log eigenvalue) over the given rank range
    (clipped to the positive eigenvalues available)."""
    ev = np.asarray(eigenvalues, dtype=np.float64)
    lo, hi = ranks
    hi = min(hi, int((ev > 0).sum()))
    if lo < 1 or hi - lo < 2:
        raise InvalidInputError(f"need positive eigenvalues at ranks {lo}..{ranks[1]}; have {int((ev > 0).sum())}")
    r = np.arange(lo, hi + 1)
    x, y = np.log(r), np.log(ev[lo - 1 : hi])
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    r2 = 1.0 - float(resid @ resid) / max(float(((y - y.mean()) ** 2).sum()), 1e-300)
    return PowerLaw(float(slope), float(intercept), float(-slope), r2, lo, hi)


@dataclass
class TwoNN:
    """TwoNN intrinsic dimension and the points it used."""

    dimension: float
    n_points: int
    n_used: int  # after dropping duplicates and the discarded tail


def twonn_dimension(
    X_ND: np.ndarray, *, discard_fraction: float = 0.1, max_points: int = 20000, seed: int = 0
) -> TwoNN:
    """TwoNN: with `mu = r2 / r1` (second over first neighbour distance), the empirical
    `-log(1 - F(mu))` is linear in `log mu` with slope equal to the dimension; fit through
    the origin after discarding the largest `discard_fraction` of mu. At most
    `max_points` rows (a seeded subsample) are used."""
    X = np.ascontiguousarray(X_ND, dtype=np.float32)
    if X.ndim != 2 or X.shape[0] < 10:
        raise InvalidInputError(f"TwoNN needs a 2-D array with >= 10 rows, got shape {X.shape}")
    if len(X) > max_points:
        X = X[np.random.default_rng(seed).choice(len(X), max_points, replace=False)]
    index = faiss.IndexFlatL2(X.shape[1])
    index.add(X)
    dist2, _ = index.search(X, 3)
    d = np.sqrt(np.maximum(dist2.astype(np.float64), 0.0))
    # column 0 is the point itself (distance 0); a point with a duplicate has r1 = 0 and is dropped
    r1, r2 = d[:, 1], d[:, 2]
    ok = r1 > 0
    mu = np.sort(r2[ok] / r1[ok])
    n = len(mu)
    keep = int(np.floor(n * (1 - discard_fraction)))
    if keep < 5:
        raise InvalidInputError("too few distinct points for TwoNN")
    F = np.arange(1, n + 1) / n
    x, y = np.log(mu[:keep]), -np.log(1 - F[:keep])
    dim = float((x @ y) / max(float(x @ x), 1e-300))
    return TwoNN(dim, int(X_ND.shape[0]), keep)
