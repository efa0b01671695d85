"""Find multi-dimensional (e.g. circular) features in an SAE and rank them (Engels et al. 2024).

Pipeline: cluster features by unit decoder rows (`geometry.clusters`), rebuild each
cluster's part of the activations on the tokens where it fires,
`r(t) = sum_{i in C} f_i(t) d_i` (no bias), take its top principal components, and score
irreducibility over consecutive PC pairs (`geometry.irreducibility`). The ranked table has
one row per cluster with its scores, size, top tokens and a 2-D projection (PC1, PC2) of a
seeded sample of its tokens; `api.analyses.circular.write_circular_run` stores it as
`analyses/circular/<run>.parquet` + `<run>.json`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import polars as pl
import scipy.sparse as sp

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.clusters import graph_clusters, spectral_clusters
from sae_atlas.geometry.irreducibility import irreducibility

ANALYSIS_KIND = "circular"
ClusterMethod = Literal["graph", "spectral"]
CLUSTER_METHODS: tuple[ClusterMethod, ...] = get_args(ClusterMethod)


@dataclass
class DiscoveryParams:
    """Parameters of a discovery run (recorded in `<run>.json`)."""

    method: ClusterMethod = "graph"
    k: int = 2  # graph: neighbours per feature
    threshold: float = 0.5  # graph: cosine cutoff
    n_clusters: int | None = None  # spectral: default min(F // 20, 256), at least 2
    n_neighbors: int = 30  # spectral: kNN affinity width above dense_max features
    dense_max: int = 4096  # spectral: dense affinity up to this many features
    min_size: int = 2
    max_size: int = 256  # larger clusters are skipped (counted in the summary)
    min_tokens: int = 32  # clusters firing on fewer tokens are skipped
    n_components: int = 5
    eps: float = 0.1
    n_bins: int = 10
    max_points: int = 4000  # tokens used for the irreducibility scores
    projection_points: int = 1000  # tokens stored in the 2-D projection
    top_tokens: int = 10
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class DiscoveryResult:
    """The ranked table plus the run's parameters and summary."""

    table: pl.DataFrame
    params: DiscoveryParams
    summary: dict[str, Any] = field(default_factory=dict)


def cluster_features(W_dec_FD: np.ndarray, params: DiscoveryParams) -> list[np.ndarray]:
    """Clusters of feature indices by the method in `params` (see `geometry.clusters`)."""
    if params.method == "graph":
        return graph_clusters(W_dec_FD, k=params.k, threshold=params.threshold, min_size=params.min_size)
    if params.method == "spectral":
        n = params.n_clusters or max(2, min(W_dec_FD.shape[0] // 20, 256))
        return spectral_clusters(
            W_dec_FD, n, seed=params.seed, n_neighbors=params.n_neighbors,
            dense_max=params.dense_max, min_size=params.min_size,
        )
    raise InvalidInputError(f"unknown clustering method {params.method!r}; valid: {', '.join(CLUSTER_METHODS)}")


def cluster_reconstruction(
    acts_csc: sp.csc_matrix, W_dec_FD: np.ndarray, cluster: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows where the cluster fires and its reconstruction there, in a compact basis.

    Returns `(token_rows [n], coords [n, c], basis [c, d])` with `r(t) = coords @ basis`
    exactly (`basis` orthonormal rows spanning the cluster's decoder rows), so PCA can run
    in c <= |C| dimensions instead of d.
    """
    sub = acts_csc[:, cluster].tocsr()
    rows = np.flatnonzero(np.diff(sub.indptr))
    a = sub[rows].toarray().astype(np.float64)  # [n, |C|]
    D = np.asarray(W_dec_FD[cluster], dtype=np.float64)  # [|C|, d]
    Q, R = np.linalg.qr(D.T)  # D^T = Q R, Q [d, c]
    return rows, a @ R.T, Q.T


def _pca(Y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    Yc = Y - Y.mean(0)
    _, s, Vt = np.linalg.svd(Yc, full_matrices=False)
    k = min(k, Vt.shape[0])
    var = s**2
    return Yc @ Vt[:k].T, Vt[:k], var[:k] / max(var.sum(), 1e-300)


def _top_tokens(token_ids: np.ndarray, weights: np.ndarray, n: int) -> tuple[list[int], list[float]]:
    uniq, inv = np.unique(token_ids, return_inverse=True)
    mass = np.bincount(inv, weights=weights)
    order = np.argsort(-mass, kind="stable")[:n]
    total = max(float(mass.sum()), 1e-300)
    return [int(t) for t in uniq[order]], [float(m / total) for m in mass[order]]


def discover_circular(
    W_dec_FD: np.ndarray,
    acts_TF: sp.csr_matrix,
    token_ids_T: np.ndarray,
    params: DiscoveryParams | None = None,
    *,
    vocab: list[str] | None = None,
) -> DiscoveryResult:
    """Cluster features, score each cluster's reconstruction, return the ranked table.

    `W_dec_FD` decoder rows [F, d]; `acts_TF` a sparse CSR matrix of feature activations
    [tokens, F]; `token_ids_T` the token id of each row. `vocab` (token strings by id), if
    given, adds a `top_token_strs` column. Rows are ranked by `score`, the mean over
    consecutive PC pairs of `(1 - M) * S`.
    """
    params = params or DiscoveryParams()
    W = np.asarray(W_dec_FD, dtype=np.float32)
    if not sp.issparse(acts_TF) or acts_TF.ndim != 2:
        raise InvalidInputError("activations must be a scipy.sparse matrix [tokens, features]")
    if acts_TF.shape[1] != W.shape[0]:
        raise InvalidInputError(
            f"activations have {acts_TF.shape[1]} features but W_dec has {W.shape[0]} rows"
        )
    token_ids_T = np.asarray(token_ids_T, dtype=np.int64)
    if token_ids_T.shape != (acts_TF.shape[0],):
        raise InvalidInputError(f"token_ids must have shape [{acts_TF.shape[0]}], got {token_ids_T.shape}")

    t0 = time.perf_counter()
    clusters = cluster_features(W, params)
    t_cluster = time.perf_counter() - t0
    acts_csc = sp.csc_matrix(acts_TF)
    rng = np.random.default_rng(params.seed)
    records, skipped = [], {"too_large": 0, "too_few_tokens": 0}
    for cid, members in enumerate(clusters):
        if len(members) > params.max_size:
            skipped["too_large"] += 1
            continue
        rows, coords, _ = cluster_reconstruction(acts_csc, W, members)
        if len(rows) < max(params.min_tokens, 4):
            skipped["too_few_tokens"] += 1
            continue
        Z, _, evr = _pca(coords, params.n_components)
        if Z.shape[1] < 2:
            skipped["too_few_tokens"] += 1
            continue
        scores = irreducibility(
            Z, eps=params.eps, n_bins=params.n_bins, max_points=params.max_points, seed=params.seed
        )
        norms = np.linalg.norm(coords, axis=1)
        top_ids, top_mass = _top_tokens(token_ids_T[rows], norms, params.top_tokens)
        take = np.sort(rng.choice(len(rows), min(len(rows), params.projection_points), replace=False))
        rec = {
            "cluster_id": cid,
            "size": len(members),
            "features": [int(f) for f in members],
            "n_tokens": len(rows),
            "score": scores["score"],
            "mixture": scores["mixture"],
            "separability": scores["separability"],
            "pair_score": scores["pair_score"],
            "explained_variance_ratio": [float(x) for x in evr],
            "top_token_ids": top_ids,
            "top_token_mass": top_mass,
            "proj_x": Z[take, 0].tolist(),
            "proj_y": Z[take, 1].tolist(),
            "proj_token_ids": token_ids_T[rows[take]].tolist(),
            "proj_rows": rows[take].tolist(),
        }
        if vocab is not None:
            rec["top_token_strs"] = [vocab[t] if 0 <= t < len(vocab) else f"<{t}>" for t in top_ids]
        records.append(rec)
    records.sort(key=lambda r: (-r["score"], r["cluster_id"]))
    for rank, rec in enumerate(records):
        rec["rank"] = rank
    table = pl.DataFrame(records, schema=_schema(vocab is not None)) if records else _empty(vocab is not None)
    summary = {
        "n_features": int(W.shape[0]),
        "n_tokens": int(acts_TF.shape[0]),
        "n_clusters": len(clusters),
        "n_scored": len(records),
        "skipped": skipped,
        "seconds_clustering": round(t_cluster, 3),
        "seconds_total": round(time.perf_counter() - t0, 3),
    }
    return DiscoveryResult(table.select(["rank", *[c for c in table.columns if c != "rank"]]), params, summary)


def _schema(with_strs: bool) -> dict[str, pl.DataType]:
    f64, i64 = pl.Float64, pl.Int64
    schema: dict[str, Any] = {
        "cluster_id": i64, "size": i64, "features": pl.List(i64), "n_tokens": i64,
        "score": f64, "mixture": pl.List(f64), "separability": pl.List(f64),
        "pair_score": pl.List(f64), "explained_variance_ratio": pl.List(f64),
        "top_token_ids": pl.List(i64), "top_token_mass": pl.List(f64),
        "proj_x": pl.List(f64), "proj_y": pl.List(f64), "proj_token_ids": pl.List(i64),
        "proj_rows": pl.List(i64),
    }
    if with_strs:
        schema["top_token_strs"] = pl.List(pl.String)
    schema["rank"] = i64
    return schema


def _empty(with_strs: bool) -> pl.DataFrame:
    return pl.DataFrame(schema=_schema(with_strs))
