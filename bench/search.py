"""Search latency: exact FAISS vs numpy brute force, and the approximate index at scale.

    python bench/search.py [--sizes 16384,100000] [--approx-rows 1000000] [--d 768] [--background-load N]

Exact search is timed three ways: FAISS `IndexFlatIP`, the certified 8-bit scan
(`store.int8_scan.Int8Scan`, which the atlas uses for large exact indexes) and numpy.
Rows are unit vectors drawn around random cluster centres (so the approximate index
is tested on structured data); queries are held-out points from the same distribution,
one at a time. Prints p50/p99 latency per query, the speed-up ratios and recall@10.
`--background-load N` keeps N other processes busy (single-threaded float GEMMs) while
everything is timed, as on a service that has other work in flight. The int8 scan is timed
with all torch threads and with its default (1); the ratios use the default.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import torch
from safetensors.torch import save_file

from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.index import build_atlas_indexes, build_index
from sae_atlas.store.int8_scan import Int8Scan
from sae_atlas.store.search import FeatureSearch

_SPIN = "import os, numpy as np\nparent = os.getppid()\na = np.random.rand(512, 512)\nwhile os.getppid() == parent: a @ a"


@contextlib.contextmanager
def background_load(processes: int):
    """`processes` busy single-threaded GEMM loops for the duration (they also stop if we die)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN], env=env) for _ in range(processes)]
    try:
        time.sleep(1.0 if processes else 0.0)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def clustered(n: int, d: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    out = np.empty((n, d), dtype=np.float32)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        pick = centres[rng.integers(0, len(centres), m)]
        out[start:start + m] = unit_rows(pick + 0.35 * rng.standard_normal((m, d)).astype(np.float32) / np.sqrt(d) * 4)
    return out


def latencies(fn, queries: np.ndarray, threads: int = 1) -> np.ndarray:
    """Per-query ms of `fn`, one query at a time, with `threads` FAISS threads."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    times = []
    for q in queries:
        start = time.perf_counter()
        fn(q[None, :])
        times.append(time.perf_counter() - start)
    faiss.omp_set_num_threads(before)
    return np.array(times) * 1e3


def report(name: str, ms: np.ndarray) -> float:
    p50, p99 = np.percentile(ms, [50, 99])
    print(f"  {name:<28} p50 {p50:8.3f} ms   p99 {p99:8.3f} ms")
    return float(p50)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / truth.shape[1] for f, t in zip(found, truth, strict=True)]))


def facade_latency(rows: np.ndarray, queries: np.ndarray, threads: int) -> np.ndarray:
    """Per-query ms of `FeatureSearch.by_vector` (checks, FAISS, id mapping) over a temporary atlas."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "saes" / "bench"
        folder.mkdir(parents=True)
        d_sae, d_in = rows.shape
        save_file({"W_dec": torch.from_numpy(rows), "W_enc": torch.zeros(1), "b_enc": torch.zeros(1),
                   "b_dec": torch.zeros(d_in)}, str(folder / "sae_weights.safetensors"))
        (folder / "cfg.json").write_text(json.dumps({"d_in": d_in, "d_sae": d_sae,
                                                     "metadata": {"hook_name": "blocks.0.hook_resid_post"}}))
        build_atlas_indexes(tmp)
        search = FeatureSearch(tmp)
        search.by_vector(queries[0], k=10, sae_id="bench")  # loads and caches the index
        return latencies(lambda q: search.by_vector(q[0], k=10, sae_id="bench"), queries, threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16384,100000")
    parser.add_argument("--approx-rows", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2, help="FAISS threads while building.")
    parser.add_argument("--query-threads", type=int, default=1, help="FAISS threads while timing queries.")
    parser.add_argument("--clusters", type=int, default=3000, help="Gaussian mixture components on the sphere.")
    parser.add_argument("--background-load", type=int, default=0, help="Busy processes running while timing.")
    args = parser.parse_args()
    with background_load(args.background_load):
        run(args)


def run(args: argparse.Namespace) -> None:
    """Build the data and time every method (inside whatever load `main` set up)."""
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    centres = unit_rows(rng.standard_normal((args.clusters, args.d)).astype(np.float32))
    for n in [int(s) for s in args.sizes.split(",") if s]:
        rows = clustered(n, args.d, rng, centres)
        queries = clustered(args.queries, args.d, rng, centres)
        index, _ = build_index(rows, approx_threshold=n + 1)
        print(f"exact top-10 over {n} rows, d {args.d}")
        faiss_p50 = report("FAISS IndexFlatIP", latencies(lambda q, ix=index: ix.search(q, 10), queries, args.query_threads))
        scan = Int8Scan(rows)
        for threads in sorted({torch.get_num_threads(), scan.threads}, reverse=True):  # the default last
            scan.threads = threads
            scan_p50 = report(f"Int8Scan ({threads} torch threads)",
                              latencies(lambda q, s=scan: s.search(q, 10), queries, args.query_threads))
        numpy_p50 = report("numpy brute force", latencies(
            lambda q, r=rows: np.argpartition(-(r @ q[0]), 10)[:10], queries, args.query_threads))
        scan.candidates_seen = 0
        same = np.mean(scan.search(queries, 10)[1] == index.search(queries, 10)[1])
        print(f"  Int8Scan ids equal to FAISS: {same:.4f}; rows re-scored per query: "
              f"{scan.candidates_seen / len(queries):.0f}")
        print(f"  speed-up FAISS / numpy: {numpy_p50 / faiss_p50:.1f}x; Int8Scan / FAISS: {faiss_p50 / scan_p50:.1f}x; "
              f"Int8Scan / numpy: {numpy_p50 / scan_p50:.1f}x")
        report("FeatureSearch.by_vector", facade_latency(rows, queries, args.query_threads))
        del rows, index
    if args.approx_rows:
        n = args.approx_rows
        rows = clustered(n, args.d, rng, centres)
        queries = clustered(args.queries, args.d, rng, centres)
        start = time.perf_counter()
        approx, info = build_index(rows, approx_threshold=1, seed=0)
        build = time.perf_counter() - start
        _, truth = faiss.knn(queries, rows, 10, metric=faiss.METRIC_INNER_PRODUCT)  # exact, no copy of rows
        _, found = approx.search(queries, 10)
        print(f"approximate top-10 over {n} rows, d {args.d}: {info['type']} {info['params']}, "
              f"built in {build:.0f} s, recorded recall@10 {info['recall_at_10']:.3f}")
        approx_p50 = report("approximate (IVF-PQ + re-rank)", latencies(lambda q: approx.search(q, 10), queries, args.query_threads))
        exact_p50 = report("exact FAISS (knn)", latencies(
            lambda q: faiss.knn(q, rows, 10, metric=faiss.METRIC_INNER_PRODUCT), queries[:20], args.query_threads))
        numpy_p50 = report("numpy brute force", latencies(
            lambda q: np.argpartition(-(rows @ q[0]), 10)[:10], queries[:20], args.query_threads))
        print(f"  recall@10 on held-out queries: {recall(found, truth):.3f}")
        print(f"  speed-up vs exact FAISS: {exact_p50 / approx_p50:.1f}x; vs numpy: {numpy_p50 / approx_p50:.1f}x")


if __name__ == "__main__":
    main()
