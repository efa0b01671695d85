"""Where each SAE feature fires, in depth terms: the local intrinsic dimension (at the
feature's layer) and the trajectory of the tokens it fires on, beside every token's.

A feature whose tokens have a lower local dimension than the tokens overall fires "where the
representation is compressing"; the shift is reported as the difference of means and as a
z-score against the mean of as many tokens drawn at random (`sd / sqrt(n)`).
"""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy import sparse

from sae_atlas.errors import InvalidInputError


def feature_depth_table(codes_MF: np.ndarray | sparse.spmatrix, token_metrics: dict[str, np.ndarray], *,
                        min_fires: int = 5) -> pl.DataFrame:
    """Per feature firing (> 0) on at least `min_fires` of the `M` tokens: `n_fires` and,
    for every per-token metric (`{name: [M]}`, e.g. `lid`, `convergence_index`), the mean
    over its tokens, the shift from the all-token mean and that shift's z-score."""
    codes = sparse.csc_matrix(codes_MF)
    M = codes.shape[0]
    if any(len(v) != M for v in token_metrics.values()):
        raise InvalidInputError(f"token metrics must have one value per token ({M}); got "
                                f"{ {k: len(v) for k, v in token_metrics.items()} }")
    fires = (codes > 0).astype(np.float64)
    n_fires = np.asarray(fires.sum(axis=0)).ravel()
    keep = np.flatnonzero(n_fires >= min_fires)
    columns: dict[str, np.ndarray] = {"feature": keep, "n_fires": n_fires[keep].astype(np.int64)}
    for name, values in token_metrics.items():
        v = np.asarray(values, dtype=np.float64)
        ok = np.isfinite(v)
        v0 = np.where(ok, v, 0.0)
        sums = np.asarray(fires.T @ v0).ravel()[keep]
        counts = np.asarray(fires.T @ ok.astype(np.float64)).ravel()[keep]
        mean_all, sd_all = float(v[ok].mean()), float(v[ok].std())
        with np.errstate(invalid="ignore", divide="ignore"):
            means = sums / counts
            z = (means - mean_all) / (sd_all / np.sqrt(counts))
        columns |= {f"{name}_mean": means, f"{name}_shift": means - mean_all, f"{name}_z": z}
    return pl.DataFrame(columns)
