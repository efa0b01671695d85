"""The maths layer of `galaxy`; its other layers: `sae_atlas.api.analyses.galaxy` (analysis-run).

Galaxy-scale shape of a dictionary (Li, Michaud, Tegmark et al. 2024, "The Geometry of
Concepts"): the eigenvalue spectrum of the decoder-row covariance follows a power law
whose slope, fitted on log-eigenvalue vs log-rank over ranks 10-150, is steepest in the
middle layers. The galaxy's TwoNN intrinsic dimension lives in
`geometry.intrinsic_dimension`, shared with the depth analysis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.vectors import unit_rows


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
