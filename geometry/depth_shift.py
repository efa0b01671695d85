"""The shift in intrinsic and local dimension per layer between two models read on the same
tokens (a base model and its fine-tuned copy, say), with its null.

The tokens are paired (row `i` of both clouds is one token), so each statistic is a function
of per-token values of either model: the local dimension of the token (LID; its shift is a
difference of means) and the token's Levina-Bickel inverse estimate (the MLE dimension is
`1 / mean` of these). For each:

- a bootstrap interval: tokens resampled with replacement, the same draw for both models;
- a paired permutation p-value: under "the two models are exchangeable at this layer", each
  token's two values may be swapped, so the null draws swap a random half of them; two-sided,
  `(1 + #{|null| >= |shift|}) / (1 + n_permutations)`.

A layer the two models compute identically has shift 0 and p = 1. TwoNN is reported for
both models beside them, without a null (its fit is not a mean over tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.intrinsic_dimension import (
    inverse_estimates,
    local_dimension,
    twonn_dimension,
)

ShiftStatistic = Literal["mean", "inverse_mean"]  # LID: mean of per-token values; MLE: 1 / mean of inverses


@dataclass
class PairedShift:
    """`statistic(b) - statistic(a)` over paired tokens, its bootstrap interval and p-value."""

    a: float
    b: float
    shift: float
    low: float
    high: float
    p_value: float


def _stat(values_RN: np.ndarray, statistic: ShiftStatistic) -> np.ndarray:
    m = values_RN.mean(axis=-1)
    return m if statistic == "mean" else 1.0 / m


def paired_shift(a_N: np.ndarray, b_N: np.ndarray, statistic: ShiftStatistic, *, n_boot: int = 200,
                 n_permutations: int = 1000, confidence: float = 0.9, seed: int = 0) -> PairedShift:
    """The shift of `statistic` from the per-token values `a_N` to `b_N` (the same tokens),
    with a bootstrap interval and a paired permutation p-value (see the module docstring)."""
    a, b = np.asarray(a_N, dtype=np.float64), np.asarray(b_N, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise InvalidInputError(f"a paired shift needs two equal-length vectors of >= 2 tokens, got {a.shape}, {b.shape}")
    rng = np.random.default_rng(seed)
    shift = float(_stat(b, statistic) - _stat(a, statistic))
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    boots = _stat(b[idx], statistic) - _stat(a[idx], statistic)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(boots, [tail, 1.0 - tail])
    swap = rng.random((n_permutations, len(a))) < 0.5
    null = _stat(np.where(swap, a, b), statistic) - _stat(np.where(swap, b, a), statistic)
    p = (1 + int((np.abs(null) >= abs(shift) - 1e-12).sum())) / (1 + n_permutations)
    return PairedShift(float(_stat(a, statistic)), float(_stat(b, statistic)), shift, float(low), float(high), p)


def depth_shift_table(states_a_MLD: np.ndarray, states_b_MLE: np.ndarray, layers: list[int], *, k: int = 20,
                      mle_k: int = 10, n_boot: int = 200, n_permutations: int = 1000, seed: int = 0) -> pl.DataFrame:
    """Per layer of `layers` (axis 1 of both state arrays, the same `M` tokens in the same
    order): TwoNN of both models, and the MLE dimension and mean local dimension of both
    with their shift from A to B, its interval and p-value."""
    A, B = np.asarray(states_a_MLD), np.asarray(states_b_MLE)
    if A.ndim != 3 or B.ndim != 3 or A.shape[:2] != B.shape[:2] or A.shape[1] != len(layers):
        raise InvalidInputError(f"a depth shift needs states [tokens, {len(layers)} layers, d] of the same tokens "
                                f"for both models, got {A.shape} and {B.shape}")
    rows = []
    for i, layer in enumerate(layers):
        row: dict[str, float | int] = {"layer": layer, "twonn_a": twonn_dimension(A[:, i], seed=seed).dimension,
                                       "twonn_b": twonn_dimension(B[:, i], seed=seed).dimension}
        per_token = {"mle": [inverse_estimates(X[:, i], k=mle_k) for X in (A, B)],
                     "lid": [local_dimension(X[:, i], k=k) for X in (A, B)]}
        for name, statistic in (("mle", "inverse_mean"), ("lid", "mean")):
            s = paired_shift(*per_token[name], statistic, n_boot=n_boot, n_permutations=n_permutations, seed=seed + i)
            row |= {f"{name}_a": s.a, f"{name}_b": s.b, f"{name}_shift": s.shift, f"{name}_shift_low": s.low,
                    f"{name}_shift_high": s.high, f"{name}_shift_p": s.p_value}
        rows.append(row)
    return pl.DataFrame(rows)
