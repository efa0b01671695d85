"""The maths layer of `maps`; its other layers: `sae_atlas.api.analyses.maps` (analysis-run),
`sae_atlas.store.maps` (persistence).

2-D maps of an SAE's features in two bases, seeded UMAP (McInnes et al. 2018) both:
`decoder`, the unit decoder rows with the cosine metric, and `cooccurrence`, the graph of
each feature's strongest co-occurrence partners (`geometry.lobes.cooccurrence_knn`, built
from the summary's occurrence matrix). This is the maths layer of the feature maps; the
persistence layer (`map.parquet` and its `map.json` sidecar) is `sae_atlas.store.maps`.

The kNN-overlap score is the fraction of each feature's `k` nearest neighbours in its
basis (cosine neighbours of the decoder rows; strongest co-occurrence partners) that are
also among its `k` nearest in the map; its mean says how far the map can be trusted,
beside the chance level `k / (F - 1)`. Each map is also scored on the other basis'
neighbours, so a user sees which basis a map is faithful to.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import scipy.sparse as sp

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.clusters import knn_cosine
from sae_atlas.geometry.lobes import cooccurrence_knn
from sae_atlas.geometry.vectors import unit_rows


def umap_coords(
    W_dec_FD: np.ndarray, *, n_neighbors: int = 15, min_dist: float = 0.1, seed: int = 0, n_epochs: int | None = None
) -> np.ndarray:
    """Seeded 2-D UMAP coordinates `[F, 2]` of the unit decoder rows (cosine metric)."""
    import umap  # slow import (numba); only when a map is made

    unit = unit_rows(W_dec_FD)
    if unit.shape[0] <= n_neighbors:
        raise InvalidInputError(f"a map needs more features ({unit.shape[0]}) than n_neighbors ({n_neighbors})")
    reducer = umap.UMAP(n_neighbors=n_neighbors, min_dist=min_dist, metric="cosine", random_state=seed,
                        n_epochs=n_epochs, n_components=2, n_jobs=1)
    return np.asarray(reducer.fit_transform(unit), dtype=np.float32)


def cooccurrence_neighbours(affinity_FF: sp.spmatrix, k: int) -> np.ndarray:
    """Each feature's `k` strongest co-occurrence partners `[F, k]`, strongest first; -1
    fills the row of a feature with fewer partners."""
    A = sp.csr_matrix(affinity_FF)
    out = np.full((A.shape[0], k), -1, dtype=np.int64)
    for i in range(A.shape[0]):
        lo, hi = A.indptr[i], A.indptr[i + 1]
        order = np.argsort(-A.data[lo:hi], kind="stable")[:k]
        out[i, : len(order)] = A.indices[lo:hi][order]
    return out


def cooccurrence_coords(
    affinity_FF: sp.spmatrix, *, n_neighbors: int = 15, min_dist: float = 0.1, seed: int = 0,
    n_epochs: int | None = None,
) -> np.ndarray:
    """Seeded 2-D UMAP coordinates `[F, 2]` from a precomputed kNN graph: each feature's
    `n_neighbors - 1` strongest co-occurrence partners at distance `1 - affinity` (a feature
    with fewer partners keeps only those; one with none is placed by the layout alone)."""
    import umap

    A = sp.csr_matrix(affinity_FF)
    F = A.shape[0]
    if F <= n_neighbors:
        raise InvalidInputError(f"a map needs more features ({F}) than n_neighbors ({n_neighbors})")
    partners = cooccurrence_neighbours(A, n_neighbors - 1)
    knn_idx = np.concatenate([np.arange(F)[:, None], partners], axis=1)  # UMAP expects each point first
    weight = np.asarray(A[np.repeat(np.arange(F), n_neighbors - 1), np.maximum(partners, 0).ravel()]).reshape(F, -1)
    knn_dist = np.concatenate([np.zeros((F, 1)), np.where(partners >= 0, 1.0 - weight, 1.0)], axis=1)
    reducer = umap.UMAP(n_neighbors=n_neighbors, min_dist=min_dist, random_state=seed, n_epochs=n_epochs,
                        n_components=2, n_jobs=1, precomputed_knn=(knn_idx, knn_dist.astype(np.float32)))
    with warnings.catch_warnings():  # no search index: the map never transforms new points; a
        warnings.filterwarnings("ignore", message=".*knn_search_index.*")  # dead latent has no edge
        warnings.filterwarnings("ignore", message=".*disconnected from the manifold.*")
        coords = reducer.fit_transform(np.zeros((F, 1), dtype=np.float32))  # the graph carries the data
    return np.asarray(coords, dtype=np.float32)


def _knn_l2(X: np.ndarray, k: int, batch: int = 8192) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=np.float32)
    index = faiss.IndexFlatL2(X.shape[1])
    index.add(X)
    out = np.empty((len(X), k), dtype=np.int64)
    for start in range(0, len(X), batch):
        stop = min(start + batch, len(X))
        _, nbrs = index.search(X[start:stop], k + 1)
        keep = nbrs != np.arange(start, stop)[:, None]
        keep[keep.all(axis=1), -1] = False
        out[start:stop] = nbrs[keep].reshape(stop - start, k)
    return out


def kept_neighbours(neighbours_FK: np.ndarray, coords_F2: np.ndarray) -> np.ndarray:
    """Per feature, the share of its listed neighbours (`[F, k]`, -1 = none) found among
    its `k` nearest in the map; NaN for a feature with none listed."""
    high = np.asarray(neighbours_FK, dtype=np.int64)
    coords = np.asarray(coords_F2, dtype=np.float32)
    n, k = high.shape
    if coords.shape != (n, 2):
        raise InvalidInputError(f"coordinates must be [{n}, 2], got {coords.shape}")
    if not 1 <= k < n:
        raise InvalidInputError(f"k must be in 1..{n - 1}, got {k}")
    low = _knn_l2(coords, k)
    listed = high >= 0
    hits = ((high[:, :, None] == low[:, None, :]).any(axis=2) & listed).sum(axis=1)
    count = listed.sum(axis=1)
    return np.where(count > 0, hits / np.maximum(count, 1), np.nan)


def decoder_neighbours(W_dec_FD: np.ndarray, k: int) -> np.ndarray:
    """Each feature's `k` nearest decoder rows by cosine `[F, k]`."""
    F = np.asarray(W_dec_FD).shape[0]
    if not 1 <= k < F:
        raise InvalidInputError(f"k must be in 1..{F - 1}, got {k}")
    return knn_cosine(unit_rows(W_dec_FD), k)[1]


def knn_overlap(W_dec_FD: np.ndarray, coords_F2: np.ndarray, k: int = 10) -> np.ndarray:
    """Per feature, the share of its `k` cosine neighbours (full space) kept among its `k`
    nearest neighbours in the map."""
    return kept_neighbours(decoder_neighbours(W_dec_FD, k), coords_F2)


@dataclass
class FeatureMap:
    """A map of one SAE in one basis: coordinates, per-feature overlap with the basis' own
    neighbours (and with the other basis' when measured), and the parameters used."""

    coords_F2: np.ndarray
    overlap_F: np.ndarray
    params: dict[str, Any]
    other_overlap_F: np.ndarray | None = None

    @property
    def summary(self) -> dict[str, float]:
        n, k = len(self.overlap_F), self.params["k_overlap"]
        out = {"knn_overlap_mean": float(np.nanmean(self.overlap_F)),
               "knn_overlap_median": float(np.nanmedian(self.overlap_F)),
               "chance": k / max(n - 1, 1), "n_features": n}
        if self.other_overlap_F is not None:
            out["other_basis_overlap_mean"] = float(np.nanmean(self.other_overlap_F))
        return out


def feature_map(
    W_dec_FD: np.ndarray, *, k_overlap: int = 10, n_neighbors: int = 15, min_dist: float = 0.1, seed: int = 0,
    n_epochs: int | None = None,
) -> FeatureMap:
    """UMAP the decoder rows and score the map's neighbourhood preservation."""
    coords = umap_coords(W_dec_FD, n_neighbors=n_neighbors, min_dist=min_dist, seed=seed, n_epochs=n_epochs)
    params = {"method": "umap", "metric": "cosine", "n_neighbors": n_neighbors, "min_dist": min_dist,
              "seed": seed, "n_epochs": n_epochs, "k_overlap": k_overlap}
    return FeatureMap(coords, knn_overlap(W_dec_FD, coords, k_overlap), params)


def basis_maps(
    W_dec_FD: np.ndarray, occ_BF: sp.spmatrix | np.ndarray, *, measure: str = "jaccard", k_overlap: int = 10,
    n_neighbors: int = 15, min_dist: float = 0.1, seed: int = 0, n_epochs: int | None = None,
) -> dict[str, FeatureMap]:
    """The decoder map and the co-occurrence map of one SAE, each scored on its own basis'
    neighbours (`overlap_F`) and on the other basis' (`other_overlap_F`)."""
    if occ_BF.shape[1] != len(W_dec_FD):
        raise InvalidInputError(f"occurrence matrix has {occ_BF.shape[1]} features, the decoder {len(W_dec_FD)}")
    decoder = feature_map(W_dec_FD, k_overlap=k_overlap, n_neighbors=n_neighbors, min_dist=min_dist, seed=seed,
                          n_epochs=n_epochs)
    affinity = cooccurrence_knn(occ_BF, measure=measure, k=max(k_overlap, n_neighbors))
    coords = cooccurrence_coords(affinity, n_neighbors=n_neighbors, min_dist=min_dist, seed=seed, n_epochs=n_epochs)
    cooc_nbrs, dec_nbrs = cooccurrence_neighbours(affinity, k_overlap), decoder_neighbours(W_dec_FD, k_overlap)
    cooc = FeatureMap(coords, kept_neighbours(cooc_nbrs, coords), decoder.params | {
        "metric": f"cooccurrence-{measure}", "method": "umap-precomputed-knn"}, kept_neighbours(dec_nbrs, coords))
    decoder.other_overlap_F = kept_neighbours(cooc_nbrs, decoder.coords_F2)
    return {"decoder": decoder, "cooccurrence": cooc}


def labels_from_clusters(clusters: list[np.ndarray], n_features: int) -> np.ndarray:
    """Cluster lists (feature index arrays) as a label per feature; -1 for unclustered."""
    labels = np.full(n_features, -1, dtype=np.int64)
    for i, members in enumerate(clusters):
        labels[np.asarray(members, dtype=np.int64)] = i
    return labels
