"""Benchmark: circular-feature discovery on a large planted SAE (no dense F x F matrix).

A random decoder of F latents in d dimensions hides `--circles` planted 7-feature circles;
a CSR activation matrix has `--l0` random active latents per token plus circle features
firing on a share of tokens. Times, in one process:

- graph clustering (FAISS exact inner-product kNN, k=2, cosine > 0.5, components) against
  a baseline that forms the dense F x F cosine matrix with numpy and takes the top-k;
- spectral clustering on the sparse kNN angular affinity;
- the full pipeline (`discover_circular`: clustering + reconstruction + PCA + indices),
  checking that every planted circle comes back as one cluster.

Run: `PYTHONPATH=. python bench/circular_discovery.py --features 16384 --d 576`
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import scipy.sparse as sp

from sae_atlas.geometry.circular_discovery import DiscoveryParams, discover_circular
from sae_atlas.geometry.clusters import graph_clusters, spectral_clusters
from sae_atlas.geometry.vectors import unit_rows


def planted(F: int, d: int, n_circles: int, n_tokens: int, l0: int, seed: int):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(F, d)).astype(np.float32)
    circles = []
    t = 2 * np.pi * np.arange(7) / 7
    for c in range(n_circles):
        U, _ = np.linalg.qr(rng.normal(size=(d, 3)))
        idx = np.arange(c * 7, c * 7 + 7)
        W[idx] = U[:, 2] + 0.8 * (np.cos(t)[:, None] * U[:, 0] + np.sin(t)[:, None] * U[:, 1])
        circles.append(idx)
    rows = np.repeat(np.arange(n_tokens), l0)
    cols = rng.integers(n_circles * 7, F, n_tokens * l0)
    vals = rng.exponential(1.0, n_tokens * l0)
    which = rng.integers(0, n_circles, n_tokens)
    on = rng.random(n_tokens) < 0.3
    phi = rng.uniform(0, 2 * np.pi, n_tokens)
    bump = np.maximum(np.cos(phi[:, None] - t[None]), 0) ** 2
    r2 = np.repeat(np.flatnonzero(on), 7)
    c2 = (which[on][:, None] * 7 + np.arange(7)[None]).ravel()
    v2 = bump[on].ravel()
    keep = v2 > 0
    A = sp.csr_matrix(
        (np.r_[vals, v2[keep]], (np.r_[rows, r2[keep]], np.r_[cols, c2[keep]])), shape=(n_tokens, F)
    )
    A.sum_duplicates()
    return W, A.astype(np.float32), rng.integers(0, 50_000, n_tokens), circles


def dense_topk_baseline(W: np.ndarray, k: int) -> np.ndarray:
    """Naive baseline: the full F x F cosine matrix, then top-k per row."""
    U = unit_rows(W)
    G = U @ U.T
    np.fill_diagonal(G, -np.inf)
    return np.argpartition(-G, k, axis=1)[:, :k]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--features", type=int, default=16384)
    ap.add_argument("--d", type=int, default=576)
    ap.add_argument("--circles", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=50_000)
    ap.add_argument("--l0", type=int, default=32)
    ap.add_argument("--spectral-clusters", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    W, A, tok, circles = planted(args.features, args.d, args.circles, args.tokens, args.l0, args.seed)
    print(f"F={args.features} d={args.d} tokens={args.tokens} nnz={A.nnz} planted circles={args.circles}")

    t0 = time.perf_counter()
    clusters = graph_clusters(W)
    t_graph = time.perf_counter() - t0
    found = sum(any(np.array_equal(c, g) for g in clusters) for c in circles)
    rss_graph = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"graph clustering (FAISS kNN): {t_graph:.2f} s, {len(clusters)} clusters, "
          f"{found}/{len(circles)} circles exact, peak RSS {rss_graph:.0f} MiB")

    t0 = time.perf_counter()
    dense_topk_baseline(W, 2)
    t_dense = time.perf_counter() - t0
    rss_dense = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"baseline dense F x F cosine + top-k: {t_dense:.2f} s, peak RSS {rss_dense:.0f} MiB "
          f"(F x F float32 = {args.features**2 * 4 / 2**20:.0f} MiB)")
    print(f"ratio dense / FAISS kNN time: {t_dense / t_graph:.2f}")

    t0 = time.perf_counter()
    spec = spectral_clusters(W, args.spectral_clusters, seed=args.seed, n_neighbors=30, dense_max=4096)
    t_spec = time.perf_counter() - t0
    together = sum(any(np.isin(c, g).all() for g in spec) for c in circles)
    print(f"spectral clustering (sparse kNN affinity, {args.spectral_clusters} clusters): {t_spec:.2f} s, "
          f"{together}/{len(circles)} circles inside one cluster")

    t0 = time.perf_counter()
    result = discover_circular(W, A, tok, DiscoveryParams(method="graph"))
    t_pipe = time.perf_counter() - t0
    top = result.table.head(len(circles))
    ranked = sum(any(f == c.tolist() for f in top["features"].to_list()) for c in circles)
    print(f"full pipeline (graph): {t_pipe:.2f} s for {result.summary['n_scored']} scored clusters; "
          f"planted circles in the top {len(circles)}: {ranked}/{len(circles)}")


if __name__ == "__main__":
    main()
