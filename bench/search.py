"""Search latency: exact FAISS vs numpy brute force, and the approximate index at scale.

    python bench/search.py [--sizes 16384,100000] [--approx-rows 1000000] [--d 768]

Rows are unit vectors drawn around random cluster centres (so the approximate index
is tested on structured data); queries are held-out points from the same distribution,
one at a time. Prints p50/p99 latency per query, the speed-up ratios and recall@10.
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np

from store.index import build_index, unit_rows


def clustered(n: int, d: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    out = np.empty((n, d), dtype=np.float32)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        pick = centres[rng.integers(0, len(centres), m)]
        out[start:start + m] = unit_rows(pick + 0.35 * rng.standard_normal((m, d)).astype(np.float32) / np.sqrt(d) * 4)
    return out


def latencies(fn, queries: np.ndarray) -> np.ndarray:
    times = []
    for q in queries:
        start = time.perf_counter()
        fn(q[None, :])
        times.append(time.perf_counter() - start)
    return np.array(times) * 1e3


def report(name: str, ms: np.ndarray) -> float:
    p50, p99 = np.percentile(ms, [50, 99])
    print(f"  {name:<28} p50 {p50:8.3f} ms   p99 {p99:8.3f} ms")
    return float(p50)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / truth.shape[1] for f, t in zip(found, truth, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16384,100000")
    parser.add_argument("--approx-rows", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    centres = unit_rows(rng.standard_normal((2048, args.d)).astype(np.float32))
    for n in [int(s) for s in args.sizes.split(",") if s]:
        rows = clustered(n, args.d, rng, centres)
        queries = clustered(args.queries, args.d, rng, centres)
        index, _ = build_index(rows, approx_threshold=n + 1)
        print(f"exact top-10 over {n} rows, d {args.d}")
        faiss_p50 = report("FAISS IndexFlatIP", latencies(lambda q, ix=index: ix.search(q, 10), queries))
        numpy_p50 = report("numpy brute force", latencies(
            lambda q, r=rows: np.argpartition(-(r @ q[0]), 10)[:10], queries))
        print(f"  speed-up FAISS / numpy: {numpy_p50 / faiss_p50:.1f}x")
    if args.approx_rows:
        n = args.approx_rows
        rows = clustered(n, args.d, rng, centres)
        queries = clustered(args.queries, args.d, rng, centres)
        start = time.perf_counter()
        approx, info = build_index(rows, approx_threshold=1, seed=0)
        build = time.perf_counter() - start
        exact = faiss.IndexFlatIP(args.d)
        exact.add(rows)
        _, truth = exact.search(queries, 10)
        _, found = approx.search(queries, 10)
        print(f"approximate top-10 over {n} rows, d {args.d}: {info['type']} {info['params']}, "
              f"built in {build:.0f} s, recorded recall@10 {info['recall_at_10']:.3f}")
        approx_p50 = report("approximate (IVF)", latencies(lambda q: approx.search(q, 10), queries))
        exact_p50 = report("exact FAISS", latencies(lambda q: exact.search(q, 10), queries[:50]))
        numpy_p50 = report("numpy brute force", latencies(
            lambda q: np.argpartition(-(rows @ q[0]), 10)[:10], queries[:20]))
        print(f"  recall@10 on held-out queries: {recall(found, truth):.3f}")
        print(f"  speed-up vs exact FAISS: {exact_p50 / approx_p50:.1f}x; vs numpy: {numpy_p50 / approx_p50:.1f}x")


if __name__ == "__main__":
    main()
