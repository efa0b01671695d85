"""Periodic spectra of features against a cyclic concept index.

Each feature's mean activation per concept value `a in [0, p)` is a length-p signal; its
discrete Fourier power at frequencies 1..p//2 (the constant term removed) says whether the
feature varies periodically with the concept, and its dominant frequency `k` gives the
period `p / k`. Features are then grouped by dominant period.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sae_atlas.errors import InvalidInputError


@dataclass
class Spectra:
    """Fourier power per feature; `power_FK[:, j]` is frequency `j + 1` (cycles per period)."""

    period: int
    power_FK: np.ndarray  # non-constant power, each row summing to 1 (0 for flat features)
    total_power_F: np.ndarray  # unnormalised non-constant power (variance across values)
    dominant_frequency_F: np.ndarray  # in 1..p//2 (0 for flat features)
    dominant_share_F: np.ndarray  # share of non-constant power at the dominant frequency

    @property
    def dominant_period_F(self) -> np.ndarray:
        """`p / k` for the dominant frequency `k` (inf for flat features)."""
        k = self.dominant_frequency_F.astype(np.float64)
        with np.errstate(divide="ignore"):
            return np.where(k > 0, self.period / np.maximum(k, 1), np.inf)


def check_concept_values(X_ND: np.ndarray, values_N: np.ndarray, period: int) -> tuple[np.ndarray, np.ndarray]:
    """`(X as float64 [N, d], values [N])` after checking the shapes, `period >= 2` and that
    every value is an integer in `[0, period)` (InvalidInputError otherwise)."""
    X = np.asarray(X_ND, dtype=np.float64)
    a = np.asarray(values_N)
    if X.ndim != 2 or a.shape != (X.shape[0],):
        raise InvalidInputError(f"need rows [N, d] and values [N]; got {X.shape} and {a.shape}")
    if period < 2:
        raise InvalidInputError(f"period must be >= 2, got {period}")
    if not np.issubdtype(a.dtype, np.integer) or (a.size and (a.min() < 0 or a.max() >= period)):
        span = f"{a.dtype} {a.min()}..{a.max()}" if a.size else f"empty {a.dtype}"
        raise InvalidInputError(f"values must be integers in [0, {period}), got {span}")
    return X, a.astype(np.int64)


def fourier_power(acts_NF: np.ndarray, values_N: np.ndarray, period: int) -> Spectra:
    """Fourier power of each feature's per-value mean activation (see the module docstring).

    `acts_NF` may be a dense array or anything with `.toarray()` (a scipy sparse matrix);
    every concept value must occur at least once.
    """
    A, v = check_concept_values(acts_NF.toarray() if hasattr(acts_NF, "toarray") else acts_NF, values_N, period)
    counts = np.bincount(v, minlength=period)
    if len(counts) != period or (counts == 0).any():
        raise InvalidInputError(f"every concept value 0..{period - 1} must occur; counts {counts.tolist()}")
    means_PF = np.zeros((period, A.shape[1]))
    np.add.at(means_PF, v, A)
    means_PF /= counts[:, None]
    spec = np.abs(np.fft.rfft(means_PF, axis=0)) ** 2  # [p//2 + 1, F]
    spec = spec[1:].T  # drop the constant term -> [F, p//2]
    if period % 2 == 0:
        spec[:, -1] /= 2.0  # the Nyquist term has no mirror image
    total = spec.sum(1)
    flat = total <= 1e-12 * max(float(total.max(initial=0.0)), 1e-300)
    norm = np.where(flat[:, None], 0.0, spec / np.where(flat, 1.0, total)[:, None])
    dom = np.where(flat, 0, norm.argmax(1) + 1)
    share = np.where(flat, 0.0, norm.max(1))
    return Spectra(period, norm, total, dom.astype(np.int64), share)


def cluster_by_period(spectra: Spectra, *, min_share: float = 0.5, min_power: float = 0.0) -> dict[float, np.ndarray]:
    """Group features by dominant period, keeping those whose dominant frequency holds at
    least `min_share` of the non-constant power and whose total power exceeds `min_power`.
    Returns `{period: sorted feature indices}`, periods in decreasing order."""
    keep = (spectra.dominant_frequency_F > 0) & (spectra.dominant_share_F >= min_share)
    keep &= spectra.total_power_F > min_power
    periods = spectra.dominant_period_F
    out: dict[float, np.ndarray] = {}
    for per in sorted({float(p) for p in periods[keep]}, reverse=True):
        out[per] = np.flatnonzero(keep & (periods == per))
    return out
