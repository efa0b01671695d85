"""Cluster SAE features by the directions of their decoder rows (Engels et al. 2024).

Two methods over L2-normalised decoder rows `W_dec [F, d]`:

- graph: every row's top-k neighbours by cosine (an exact FAISS inner-product search),
  keep the edges whose cosine exceeds a cutoff, and return connected components;
- spectral: affinity `1 - arccos(cos) / pi` (the angular similarity) fed to a seeded
  sklearn `SpectralClustering(affinity="precomputed")`; dense F x F below `dense_max`
  rows, otherwise a sparse symmetric kNN affinity so memory stays O(F k).
"""

from __future__ import annotations

import faiss
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.vectors import unit_rows


def knn_cosine(unit_FD: np.ndarray, k: int, batch: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-`k` neighbours (self excluded) of every unit row: `(cos [F, k], idx [F, k])`.

    Uses a FAISS `IndexFlatIP` and queries in batches so the result is the only O(F k) memory.
    Missing neighbours (F <= k) are marked with index -1 and cosine -inf.
    """
    n, d = unit_FD.shape
    if k < 1:
        raise InvalidInputError(f"k must be >= 1, got {k}")
    index = faiss.IndexFlatIP(d)
    index.add(unit_FD)
    kk = min(k + 1, n)
    cos = np.full((n, k), -np.inf, dtype=np.float32)
    idx = np.full((n, k), -1, dtype=np.int64)
    for start in range(0, n, batch):
        stop = min(start + batch, n)
        sims, nbrs = index.search(unit_FD[start:stop], kk)
        keep = nbrs != np.arange(start, stop)[:, None]  # drop self, wherever ties put it
        keep[keep.all(axis=1), -1] = False  # self not returned: drop the extra neighbour
        width = kk - 1
        idx[start:stop, :width] = nbrs[keep].reshape(-1, width)
        cos[start:stop, :width] = sims[keep].reshape(-1, width)
    return cos, idx


def _knn_edges(cos_FK: np.ndarray, idx_FK: np.ndarray, keep_FK: np.ndarray) -> tuple[np.ndarray, ...]:
    rows = np.repeat(np.arange(idx_FK.shape[0]), idx_FK.shape[1])
    keep = keep_FK.ravel() & (idx_FK.ravel() >= 0)
    return rows[keep], idx_FK.ravel()[keep], cos_FK.ravel()[keep]


def graph_clusters(
    W_dec_FD: np.ndarray,
    *,
    k: int = 2,
    threshold: float = 0.5,
    min_size: int = 2,
    mutual: bool = False,
) -> list[np.ndarray]:
    """Connected components of the top-`k` cosine graph with edges of cosine > `threshold`.

    Edges are undirected: an edge exists when either row lists the other among its top-`k`
    (the paper's rule), or, with `mutual=True`, only when both do, which stops a stray row
    from chaining onto a tight group in low dimension. Returns the components with at least
    `min_size` members as sorted index arrays, largest first (ties by smallest member).
    """
    unit = unit_rows(W_dec_FD)
    cos, idx = knn_cosine(unit, k)
    r, c, _ = _knn_edges(cos, idx, cos > threshold)
    n = unit.shape[0]
    graph = sp.coo_matrix((np.ones(len(r), dtype=np.int8), (r, c)), shape=(n, n)).tocsr()
    graph = graph.minimum(graph.T) if mutual else graph.maximum(graph.T)
    _, labels = connected_components(graph, directed=False)
    return labels_to_clusters(labels, min_size=min_size)


def labels_to_clusters(labels_F: np.ndarray, *, min_size: int = 2) -> list[np.ndarray]:
    """Group feature indices by label; keep groups of >= `min_size`, largest first."""
    labels_F = np.asarray(labels_F)
    order = np.argsort(labels_F, kind="stable")
    _, starts = np.unique(labels_F[order], return_index=True)
    groups = [np.sort(g) for g in np.split(order, starts[1:]) if len(g) >= min_size]
    groups.sort(key=lambda g: (-len(g), int(g[0])))
    return groups


def angular_affinity(cos: np.ndarray) -> np.ndarray:
    """Angular similarity `1 - arccos(cos) / pi`, in [0, 1]."""
    return 1.0 - np.arccos(np.clip(cos, -1.0, 1.0)) / np.pi


def spectral_affinity(
    W_dec_FD: np.ndarray, *, n_neighbors: int = 30, dense_max: int = 4096
) -> np.ndarray | sp.csr_matrix:
    """Angular-similarity affinity of unit decoder rows: dense when F <= `dense_max`, else a
    symmetric sparse kNN graph (`n_neighbors` per row, union of both directions)."""
    unit = unit_rows(W_dec_FD)
    n = unit.shape[0]
    if n <= dense_max:
        return angular_affinity(unit @ unit.T).astype(np.float64)
    cos, idx = knn_cosine(unit, n_neighbors)
    r, c, s = _knn_edges(cos, idx, np.ones_like(cos, dtype=bool))
    A = sp.coo_matrix((angular_affinity(s).astype(np.float64), (r, c)), shape=(n, n)).tocsr()
    A = A.maximum(A.T).tocsr()
    A.setdiag(1.0)
    return A


def spectral_clusters(
    W_dec_FD: np.ndarray,
    n_clusters: int,
    *,
    seed: int = 0,
    n_neighbors: int = 30,
    dense_max: int = 4096,
    min_size: int = 2,
) -> list[np.ndarray]:
    """Seeded spectral clustering of unit decoder rows on angular similarity.

    Returns clusters with at least `min_size` members, largest first. A sparse kNN
    affinity is used above `dense_max` rows (see `spectral_affinity`); its eigenvectors
    come from LOBPCG (several times faster than ARPACK's shift-invert there), the dense
    affinity's from ARPACK.
    """
    n = np.asarray(W_dec_FD).shape[0]
    if not 2 <= n_clusters < n:
        raise InvalidInputError(f"n_clusters must be in [2, F) with F={n}, got {n_clusters}")
    affinity = spectral_affinity(W_dec_FD, n_neighbors=n_neighbors, dense_max=dense_max)
    # scikit-learn is imported on use: importing it loads rich (a CLI library)
    from sklearn.cluster import SpectralClustering
    model = SpectralClustering(
        n_clusters=n_clusters,
        affinity="precomputed",
        random_state=seed,
        assign_labels="cluster_qr",
        eigen_solver="lobpcg" if sp.issparse(affinity) else "arpack",
    )
    labels = model.fit_predict(affinity)
    return labels_to_clusters(labels, min_size=min_size)
