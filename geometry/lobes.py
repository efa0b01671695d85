"""The maths layer of `lobes`; its other layers: `sae_atlas.api.analyses.lobes` (analysis-run).

Lobes: features that fire in the same documents cluster together (Li, Michaud, Tegmark
et al. 2024, "The Geometry of Concepts: Sparse Autoencoder Feature Structure").

From a sparse `[blocks x features]` occurrence matrix (a feature occurs in a block when
it fires on any of its tokens), co-occurrence counts come from a sparse matmul of the
binary matrix, a chunk of features at a time; each feature keeps only its top-k
neighbours, so memory is O(F k) plus one bounded chunk (never a dense F x F matrix).
Affinities: Jaccard, Dice, overlap coefficient, or the phi coefficient clipped at 0
(`phi + 1` would give every pair a positive weight and ruin spectral clustering). The
kNN affinity is spectral-clustered, and clusterings are compared by adjusted mutual
information (AMI) against label permutations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sae_atlas.errors import InvalidInputError

MEASURES = ("jaccard", "dice", "overlap", "phi")


def binary_occurrence(occ_BF: sp.spmatrix | np.ndarray) -> sp.csr_matrix:
    """The occurrence matrix as CSR float32 with ones where a feature occurs in a block."""
    occ = sp.csr_matrix(occ_BF)
    if occ.ndim != 2 or occ.shape[0] == 0 or occ.shape[1] < 2:
        raise InvalidInputError(f"occurrence matrix must be [blocks, features] with >= 2 features, got {occ.shape}")
    out = (occ != 0).astype(np.float32).tocsr()
    out.eliminate_zeros()
    return out


def _affinity(C: np.ndarray, n_rows: np.ndarray, n_all: np.ndarray, n_blocks: int, measure: str) -> np.ndarray:
    ni, nj = n_rows[:, None], n_all[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        if measure == "jaccard":
            A = C / (ni + nj - C)
        elif measure == "dice":
            A = 2 * C / (ni + nj)
        elif measure == "overlap":
            A = C / np.minimum(ni, nj)
        else:
            A = (n_blocks * C - ni * nj) / np.sqrt(ni * nj * (n_blocks - ni) * (n_blocks - nj))
    A[~np.isfinite(A)] = 0.0
    return np.clip(A, 0.0, None)


def cooccurrence_knn(
    occ_BF: sp.spmatrix | np.ndarray, *, measure: str = "jaccard", k: int = 20, chunk_mb: float = 256.0
) -> sp.csr_matrix:
    """Symmetric sparse `[F x F]` co-occurrence affinity keeping each feature's top-`k`
    neighbours (union of both directions, zero diagonal). Work memory is one dense
    `[chunk x F]` float32 block of at most `chunk_mb` megabytes."""
    if measure not in MEASURES:
        raise InvalidInputError(f"unknown co-occurrence measure {measure!r}; valid: {', '.join(MEASURES)}")
    B = binary_occurrence(occ_BF)
    n_blocks, F = B.shape
    if not 1 <= k < F:
        raise InvalidInputError(f"k must be in 1..{F - 1}, got {k}")
    counts = np.asarray(B.sum(axis=0), dtype=np.float64).ravel()
    Bt = B.T.tocsr()
    chunk = int(max(1, min(F, chunk_mb * 2**20 // (F * 4 * 3))))
    rows, cols, vals = [], [], []
    for start in range(0, F, chunk):
        stop = min(start + chunk, F)
        C = (Bt[start:stop] @ B).toarray().astype(np.float64)
        A = _affinity(C, counts[start:stop], counts, n_blocks, measure).astype(np.float32)
        A[np.arange(stop - start), np.arange(start, stop)] = 0.0
        top = np.argpartition(-A, k - 1, axis=1)[:, :k]
        v = np.take_along_axis(A, top, axis=1)
        keep = v > 0
        rows.append(np.repeat(np.arange(start, stop), k)[keep.ravel()])
        cols.append(top[keep])
        vals.append(v[keep])
    S = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(F, F)).tocsr()
    return S.maximum(S.T).tocsr()


def spectral_lobes(affinity_FF: sp.spmatrix | np.ndarray, n_clusters: int, *, seed: int = 0) -> np.ndarray:
    """Seeded spectral clustering of a (sparse) affinity; features with no edge get -1."""
    A = sp.csr_matrix(affinity_FF)
    connected = np.flatnonzero(np.asarray((A != 0).sum(axis=1)).ravel() > 0)
    if not 2 <= n_clusters < len(connected):
        raise InvalidInputError(
            f"n_clusters must be in [2, {len(connected)}) (features with any co-occurrence), got {n_clusters}"
        )
    sub = A[connected][:, connected]
    # LOBPCG: ~20x faster than ARPACK on a random 4k-feature co-occurrence graph (2.6 s vs 57 s)
    # scikit-learn is imported on use: importing it loads rich (a CLI library)
    from sklearn.cluster import SpectralClustering
    model = SpectralClustering(n_clusters=n_clusters, affinity="precomputed", random_state=seed,
                               assign_labels="cluster_qr", eigen_solver="lobpcg")
    labels = np.full(A.shape[0], -1, dtype=np.int64)
    labels[connected] = model.fit_predict(sub)
    return labels


@dataclass
class ClusterComparison:
    """AMI of two labelings against a permutation null."""

    ami: float
    null_mean: float
    null_std: float
    p_value: float
    n_features: int


def compare_labels(a_F: np.ndarray, b_F: np.ndarray, *, n_perm: int = 100, seed: int = 0) -> ClusterComparison:
    """AMI between two labelings of the same features (entries < 0 in either are ignored),
    with the AMI of `n_perm` seeded permutations of `b` as the null."""
    a, b = np.asarray(a_F), np.asarray(b_F)
    if a.shape != b.shape:
        raise InvalidInputError(f"labelings differ in length: {a.shape} vs {b.shape}")
    keep = (a >= 0) & (b >= 0)
    a, b = a[keep], b[keep]
    if len(a) < 2:
        raise InvalidInputError("need at least 2 features labelled in both clusterings")
    rng = np.random.default_rng(seed)
    # scikit-learn is imported on use: importing it loads rich (a CLI library)
    from sklearn.metrics import adjusted_mutual_info_score
    ami = float(adjusted_mutual_info_score(a, b))
    null = np.array([adjusted_mutual_info_score(a, rng.permutation(b)) for _ in range(n_perm)])
    return ClusterComparison(ami, float(null.mean()), float(null.std()),
                             float((1 + (null >= ami).sum()) / (1 + n_perm)), int(len(a)))
