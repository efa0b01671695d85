"""Co-occurrence lobes and UMAP maps at SAE scale (default 16,384 latents, d=576).

Random unit decoder rows and a random sparse [blocks x features] occurrence matrix stand
in for a trained SAE. Measures wall time and peak traced memory (tracemalloc, which sees
numpy buffers) of: the sparse chunked top-k co-occurrence graph + spectral lobes, against
the dense F x F co-occurrence baseline; and the UMAP map + kNN overlap, against a PCA
map's overlap and chance. Prints the ratios.

    PYTHONPATH=. python bench/geometry_scale.py [--features 16384] [--blocks 2000]
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from sae_atlas.geometry.lobes import binary_occurrence, cooccurrence_knn, spectral_lobes
from sae_atlas.geometry.maps import feature_map, knn_overlap


def measure(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """`(result, seconds, peak MiB traced)` of one call."""
    tracemalloc.start()
    t = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, seconds, peak / 2**20


def random_occurrence(n_blocks: int, n_features: int, per_block: int, seed: int) -> sp.csr_matrix:
    """Each block fires `per_block` features drawn with Zipf-like popularity."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, n_features + 1) ** 0.7
    popularity /= popularity.sum()
    cols = np.concatenate([rng.choice(n_features, per_block, replace=False, p=popularity) for _ in range(n_blocks)])
    rows = np.repeat(np.arange(n_blocks), per_block)
    return sp.csr_matrix((rng.integers(1, 8, len(cols)), (rows, cols)), shape=(n_blocks, n_features))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=16384)
    parser.add_argument("--blocks", type=int, default=2000)
    parser.add_argument("--per-block", type=int, default=400, help="features occurring per block")
    parser.add_argument("--d", type=int, default=576)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--clusters", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    F = args.features
    occ = random_occurrence(args.blocks, F, args.per_block, args.seed)
    print(f"occurrence: {occ.shape[0]} blocks x {F} features, nnz {occ.nnz}")

    graph, t_sparse, m_sparse = measure(lambda: cooccurrence_knn(occ, measure="jaccard", k=args.k))
    print(f"sparse top-{args.k} co-occurrence: {t_sparse:.1f} s, peak {m_sparse:.0f} MiB, graph nnz {graph.nnz}")
    labels, t_spec, m_spec = measure(lambda: spectral_lobes(graph, args.clusters, seed=args.seed))
    print(f"spectral lobes ({args.clusters}): {t_spec:.1f} s, peak {m_spec:.0f} MiB, "
          f"{len(set(labels.tolist()))} labels")

    def dense() -> np.ndarray:
        B = binary_occurrence(occ)
        return (B.T @ B).toarray()  # the dense F x F baseline (float32)

    _, t_dense, m_dense = measure(dense)
    print(f"dense F x F co-occurrence baseline: {t_dense:.1f} s, peak {m_dense:.0f} MiB "
          f"(int64 at 65k features would be {65536**2 * 8 / 2**30:.0f} GiB)")
    print(f"ratio sparse/dense: time {t_sparse / t_dense:.2f}x, peak memory {m_sparse / m_dense:.2f}x")

    rng = np.random.default_rng(args.seed)
    W = rng.normal(size=(F, args.d)).astype(np.float32)
    fmap, t_map, m_map = measure(lambda: feature_map(W, k_overlap=10, seed=args.seed))
    print(f"UMAP map + kNN overlap: {t_map:.1f} s, peak {m_map:.0f} MiB, "
          f"mean overlap {fmap.summary['knn_overlap_mean']:.3f} (chance {fmap.summary['chance']:.5f})")
    Wc = W - W.mean(0)
    pca_xy = (Wc @ np.linalg.svd(Wc[:4096], full_matrices=False)[2][:2].T).astype(np.float32)
    pca_overlap = float(knn_overlap(W, pca_xy, 10).mean())
    print(f"baseline PCA map overlap {pca_overlap:.3f}; UMAP/PCA overlap ratio "
          f"{fmap.summary['knn_overlap_mean'] / max(pca_overlap, 1e-9):.1f}x")
    print(f"process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")


if __name__ == "__main__":
    with threadpool_limits(1):
        main()
