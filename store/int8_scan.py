"""Exact top-k inner-product search by a certified 8-bit scan.

A single-query exhaustive float32 scan is bound by memory bandwidth: 100k rows of
dimension 768 are 307 MB per query. `Int8Scan` keeps each row as symmetric per-row int8
codes (a quarter of the bytes) and scans those with an integer matrix product; the query
is quantized the same way. For a row x with codes x̂ and a query q with codes q̂,

    |q·x - q̂·x̂| <= ||q|| ||x - x̂|| + ||q - q̂|| ||x̂||,

so every row's true score lies in a known interval around its 8-bit score. The k-th largest
lower bound L is a score that at least k rows reach; a row whose upper bound is below L
cannot be among the top k. The remaining candidates (usually a few dozen) are re-scored
in float32 against the full rows, so the result is the exact top k, not an approximation.

Only the integer product runs in torch, with `threads` threads (1 by default); the bounds,
the pruning and the re-scoring are single-threaded numpy. Measured with other processes
busy (`bench/search.py --background-load`), every extra torch thread and every small
multi-threaded op waits on a preempted sibling thread: 2 threads were 1.4x (100k rows) to
4.5x (16k rows) slower than 1, where on idle cores they were faster (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError

# Float32 rounding of the scaled integer scores, far above its real size (~1e-7 relative).
_ROUNDING = 1e-5
_QUERY_CHUNK = 32
_THREADS_LOCK = threading.Lock()  # torch's thread count is process state: one change at a time


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` torch threads, then restore the previous count."""
    with _THREADS_LOCK:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def quantize_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8 codes and the scale of each row (`row ~= codes * scale`)."""
    peak = np.abs(rows).max(axis=1)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    codes = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
    return codes, scale


class Int8Scan:
    """Exact top-k by inner product over `rows`, scanning int8 codes and re-scoring candidates.

    `rows` (float32, [n, d]) is kept by reference (it may be a memory-mapped FAISS index's
    storage) and read only for the candidates. Has the `ntotal`, `d` and `search` of a FAISS
    index, so callers can use either; `owner` is whatever must stay alive for `rows` to be
    valid (the FAISS index whose storage they view). `threads` is the torch thread count of
    the integer product.
    """

    def __init__(self, rows: np.ndarray, owner: object = None, threads: int = 1) -> None:
        if rows.ndim != 2 or 0 in rows.shape:
            raise InvalidInputError(f"Int8Scan needs at least one row of positive dimension, got shape {rows.shape}")
        if threads < 1:
            raise InvalidInputError(f"Int8Scan needs at least one thread, got {threads}")
        self.threads = threads
        self.rows = rows
        self.owner = owner
        self.ntotal, self.d = rows.shape
        codes, scale = [], []
        norms_residual, norms_decoded = [], []
        for start in range(0, self.ntotal, 65536):  # bounded temporaries
            block = np.asarray(rows[start:start + 65536], dtype=np.float32)
            c, s = quantize_rows(block)
            decoded = c.astype(np.float32) * s[:, None]
            codes.append(c)
            scale.append(s)
            norms_residual.append(np.linalg.norm((block - decoded).astype(np.float64), axis=1))
            norms_decoded.append(np.linalg.norm(decoded.astype(np.float64), axis=1))
        self.codes = torch.from_numpy(np.concatenate(codes))
        self.scale = np.concatenate(scale)
        decoded_norm = np.concatenate(norms_decoded)
        # Per-row error bound = residual_weight * ||q|| + decoded_norm * ||q - q̂|| + rounding.
        self.residual_weight = (np.concatenate(norms_residual) + _ROUNDING * decoded_norm).astype(np.float32)
        self.decoded_norm = decoded_norm.astype(np.float32)
        self.candidates_seen = 0  # re-scored rows over all queries, for diagnostics

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and ids of each query's top `k` rows, best first (FAISS' layout)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.d)
        k = min(k, self.ntotal)
        scores = np.empty((len(queries), k), dtype=np.float32)
        ids = np.empty((len(queries), k), dtype=np.int64)
        for start in range(0, len(queries), _QUERY_CHUNK):
            chunk = queries[start:start + _QUERY_CHUNK]
            codes, scale = quantize_rows(chunk)
            residual = np.linalg.norm(chunk - codes.astype(np.float32) * scale[:, None], axis=1)
            with torch_threads(self.threads):
                dots = torch._int_mm(self.codes, torch.from_numpy(codes.T.copy())).T.contiguous().numpy()
            for j, query in enumerate(chunk):
                scores[start + j], ids[start + j] = self._exact_top(
                    query, dots[j], float(scale[j]), float(np.linalg.norm(query)), float(residual[j]), k)
        return scores, ids

    def _exact_top(self, query: np.ndarray, dots: np.ndarray, scale: float, norm: float,
                   residual: float, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top `k` of one query from its integer scores: bound, prune, re-score in float32."""
        approx = dots.astype(np.float32) * self.scale * np.float32(scale)
        bound = self.residual_weight * np.float32(norm) + self.decoded_norm * np.float32(residual) + np.float32(_ROUNDING)
        lower = approx - bound
        floor = np.partition(lower, len(lower) - k)[len(lower) - k]  # k-th largest lower bound
        candidates = np.flatnonzero(approx + bound >= floor)
        self.candidates_seen += len(candidates)
        exact = np.asarray(self.rows[candidates], dtype=np.float32) @ query
        order = np.lexsort((candidates, -exact))[:k]  # best first, lower id on a tie
        return exact[order], candidates[order].astype(np.int64)
