"""Which features separate two sets of texts: per-feature statistics over pooled activations.

Each text is one row (its feature activations pooled over tokens, e.g. the max). For two
sets `A [N, F]` and `B [M, F]` every feature gets the difference of means, the AUROC
(`P(a > b) + P(a = b) / 2`, from average ranks: the Mann-Whitney U over `N M`), Cohen's d
(difference over the pooled standard deviation), a two-sided permutation p-value of the
rank-sum statistic (the AUROC's numerator: robust to the heavy tails of sparse activations,
where a difference of means has little power), computed sequentially so that only
features whose p-value is still small get more permutations, and Benjamini-Hochberg
q-values over the features tested.

Only features active in at least one text are tested (`active_columns`); the rest cannot
differ and get difference 0, AUROC 0.5 and p = q = 1. Near-duplicate features (decoder
cosine above a threshold) are grouped by `duplicate_groups`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.stats import rankdata

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.vectors import unit_rows

MIN_TEXTS = 2
STD_FLOOR = 1e-6  # keeps Cohen's d finite when both sets are constant
PERMUTATION_BLOCK = 256
MAX_PERMUTATIONS = 1_000_000
FIRST_ROUND = 500  # permutations every tested feature gets
KEEP_GOING = 10  # features with fewer exceedances than this get more permutations


@dataclass
class ContrastStats:
    """Per-feature statistics of a contrast, arrays of length F (all features)."""

    mean_a_F: np.ndarray
    mean_b_F: np.ndarray
    diff_F: np.ndarray  # mean_a - mean_b
    auroc_F: np.ndarray  # P(a > b); 1: A higher, 0: B higher, 0.5: no separation
    effect_size_F: np.ndarray  # Cohen's d
    p_value_F: np.ndarray  # two-sided permutation p-value of the rank sum
    q_value_F: np.ndarray  # Benjamini-Hochberg over the tested features
    tested_F: np.ndarray  # bool: active in at least one text
    n_permutations: int

    @property
    def frame(self) -> pl.DataFrame:
        """One row per tested feature: latent, mean_a, mean_b, diff, auroc, effect_size,
        p_value, q_value."""
        idx = np.flatnonzero(self.tested_F)
        return pl.DataFrame({
            "latent": idx, "mean_a": self.mean_a_F[idx], "mean_b": self.mean_b_F[idx], "diff": self.diff_F[idx],
            "auroc": self.auroc_F[idx], "effect_size": self.effect_size_F[idx],
            "p_value": self.p_value_F[idx], "q_value": self.q_value_F[idx],
        })


def benjamini_hochberg(p_values: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values), monotone and capped at 1."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    ranked = p[order] * p.size / np.arange(1, p.size + 1)
    q_sorted = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    q = np.empty_like(q_sorted)
    q[order] = q_sorted
    return q


def auroc(a_NF: np.ndarray, b_MF: np.ndarray) -> np.ndarray:
    """Per-column AUROC of A against B (ties count one half), from average ranks."""
    n, m = len(a_NF), len(b_MF)
    ranks = rankdata(np.concatenate([a_NF, b_MF]), axis=0, method="average")
    u = ranks[:n].sum(0) - n * (n + 1) / 2.0
    return u / (n * m)


def cohens_d(a_NF: np.ndarray, b_MF: np.ndarray) -> np.ndarray:
    """Per-column difference of means over the pooled standard deviation (floored)."""
    n, m = len(a_NF), len(b_MF)
    pooled = ((n - 1) * a_NF.var(0, ddof=1) + (m - 1) * b_MF.var(0, ddof=1)) / max(n + m - 2, 1)
    return (a_NF.mean(0) - b_MF.mean(0)) / np.maximum(np.sqrt(pooled), STD_FLOOR)


def _rank_sums_exceed(R: np.ndarray, n: int, observed: np.ndarray, size: int,
                      rng: np.random.Generator) -> np.ndarray:
    """How many of `size` random label permutations give a rank-sum deviation from its
    null mean at least the observed one, per column of the ranks `R [N + M, F]`."""
    exceed = np.zeros(R.shape[1], dtype=np.int64)
    centre = n * (len(R) + 1) / 2.0
    slack = 1e-9  # equal deviations count as extreme despite rounding
    for start in range(0, size, PERMUTATION_BLOCK):
        rows = min(PERMUTATION_BLOCK, size - start)
        in_a = np.zeros((rows, len(R)))
        np.put_along_axis(in_a, np.argsort(rng.random((rows, len(R))), axis=1)[:, :n], 1.0, axis=1)
        exceed += (np.abs(in_a @ R - centre) >= observed - slack).sum(0)
    return exceed


def permutation_p_values(a_NF: np.ndarray, b_MF: np.ndarray, n_permutations: int, seed: int) -> np.ndarray:
    """Two-sided permutation p-values of the rank-sum (Mann-Whitney) statistic per column,
    `(1 + exceed) / (1 + permutations)`. Sequential: every column gets `FIRST_ROUND`
    seeded permutations; only columns with fewer than `KEEP_GOING` exceedances (the ones
    whose p-value needs resolution) get more, up to `n_permutations`."""
    n = len(a_NF)
    R = rankdata(np.concatenate([a_NF, b_MF]), axis=0, method="average")
    observed = np.abs(R[:n].sum(0) - n * (len(R) + 1) / 2.0)
    rng = np.random.default_rng(seed)
    exceed = np.zeros(R.shape[1], dtype=np.int64)
    used = np.zeros(R.shape[1], dtype=np.int64)
    live = np.arange(R.shape[1])
    size = min(FIRST_ROUND, n_permutations)
    while live.size and size:
        exceed[live] += _rank_sums_exceed(R[:, live], n, observed[live], size, rng)
        used[live] += size
        live = live[(exceed[live] < KEEP_GOING) & (used[live] < n_permutations)]
        size = min(4 * size, n_permutations - int(used[live].max(initial=0)))
    return (1.0 + exceed) / (1.0 + used)


def active_columns(a_NF: np.ndarray, b_MF: np.ndarray) -> np.ndarray:
    """Columns with a non-zero value in either set."""
    return np.flatnonzero((a_NF != 0).any(0) | (b_MF != 0).any(0))


def contrast_stats(
    a_NF: np.ndarray, b_MF: np.ndarray, *, n_permutations: int = 20_000, seed: int = 0,
    columns: np.ndarray | None = None,
) -> ContrastStats:
    """Contrast statistics of every feature (see the module docstring). Only `columns`
    (default: the active ones) are tested; q-values correct over those."""
    a = np.asarray(a_NF, dtype=np.float64)
    b = np.asarray(b_MF, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise InvalidInputError(f"need activations A [N, F] and B [M, F] of one width, got {a.shape} and {b.shape}")
    if len(a) < MIN_TEXTS or len(b) < MIN_TEXTS:
        raise InvalidInputError(f"each set needs at least {MIN_TEXTS} texts, got {len(a)} and {len(b)}")
    if not 1 <= n_permutations <= MAX_PERMUTATIONS:
        raise InvalidInputError(f"n_permutations must be in 1..{MAX_PERMUTATIONS}, got {n_permutations}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise InvalidInputError("activations must be finite")
    width = a.shape[1]
    cols = active_columns(a, b) if columns is None else np.asarray(columns, dtype=np.int64)
    mean_a, mean_b = a.mean(0), b.mean(0)
    diff = mean_a - mean_b
    au, d, p, q = np.full(width, 0.5), np.zeros(width), np.ones(width), np.ones(width)
    if cols.size:
        sa, sb = a[:, cols], b[:, cols]
        au[cols] = auroc(sa, sb)
        d[cols] = cohens_d(sa, sb)
        p[cols] = permutation_p_values(sa, sb, n_permutations, seed)
        q[cols] = benjamini_hochberg(p[cols])
    tested = np.zeros(width, dtype=bool)
    tested[cols] = True
    return ContrastStats(mean_a, mean_b, diff, au, d, p, q, tested, n_permutations)


def ranked(frame: pl.DataFrame, k: int, *, alpha: float = 0.05) -> pl.DataFrame:
    """The `k` rows of a contrast table (columns of `ContrastStats.frame`, tested features
    only) that separate the sets best: significant ones (q <= alpha) first, then by
    |AUROC - 0.5|, then by |effect size|; a `rank` column is added."""
    keys = [(pl.col("q_value") > alpha), -(pl.col("auroc") - 0.5).abs(), -pl.col("effect_size").abs()]
    return frame.sort(keys).head(k).with_row_index("rank").with_columns(pl.col("rank").cast(pl.Int64))


def duplicate_groups(W_dec_KD: np.ndarray, threshold: float = 0.9) -> np.ndarray:
    """Group label per row: rows whose decoder cosine reaches `threshold` (transitively)
    share a group, labelled by the position of its first row."""
    if not -1.0 <= threshold <= 1.0:
        raise InvalidInputError(f"duplicate threshold must be a cosine in [-1, 1], got {threshold}")
    k = len(W_dec_KD)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    unit = unit_rows(W_dec_KD)
    graph = sp.csr_matrix(unit @ unit.T >= threshold)
    _, labels = connected_components(graph, directed=False)
    first = {}
    for i, label in enumerate(labels.tolist()):
        first.setdefault(label, i)
    return np.array([first[label] for label in labels.tolist()], dtype=np.int64)
