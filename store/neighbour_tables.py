"""Neighbour tables: every latent's `TABLE_K` nearest decoder rows in an SAE (its own or
another of the same width), exact, by blocked float32 matrix products.

Feature pages read them instead of searching an index (similar features, cross-layer flow).
A pair of up to `TABLE_MAX_PAIRS` row pairs (4608 x 4608 ~ 21M) takes a fraction of a second
and is computed by the search process when it loads the pair. A larger pair (16384 x 16384
~ 268M row pairs, 155 GFLOP) takes tens of seconds, so `sae-atlas index` computes those once
(`build_tables`: both directions of a pair from one product) and writes each to
`indexes/neighbours/<source>/<target>.npy` with a sidecar recording both SAEs' weights
sha256 and the file's sha256. `load_table` memory-maps a table only when all three match;
a missing, stale or damaged table is not read (the lookups then go to the index, which
answers the same, more slowly) and the next `sae-atlas index` rewrites it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import IntegrityError
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.layout import AtlasLayout

TABLE_K = 16  # neighbours kept per latent in a neighbour table
TABLE_MAX_PAIRS = 32_000_000  # largest source x target rows computed on load (~0.3 s at d 576)
BLOCK_ROWS = 1024
Table = tuple[np.ndarray, np.ndarray]  # ids [n_source, width], cosines [n_source, width]; best first


def table_width(n_target: int) -> int:
    return min(TABLE_K, n_target)


def nearest_rows(a_ND: np.ndarray, b_MD: np.ndarray, *, both: bool = False) -> tuple[Table, Table | None]:
    """Each unit row of `a`'s `table_width` nearest rows of `b` by cosine, and with `both`
    each row of `b`'s nearest rows of `a`, from the same blocked products."""
    width_ab, width_ba = table_width(len(b_MD)), table_width(len(a_ND))
    ids_ab = np.empty((len(a_ND), width_ab), dtype=np.int64)
    cos_ab = np.empty((len(a_ND), width_ab), dtype=np.float32)
    best_cos = torch.full((width_ba, len(b_MD)), -torch.inf)
    best_ids = torch.zeros((width_ba, len(b_MD)), dtype=torch.int64)
    rows_b = torch.from_numpy(b_MD)
    for start in range(0, len(a_ND), BLOCK_ROWS):
        cos = torch.from_numpy(a_ND[start:start + BLOCK_ROWS]) @ rows_b.T
        top = torch.topk(cos, width_ab, dim=1)
        cos_ab[start:start + len(cos)], ids_ab[start:start + len(cos)] = top.values.numpy(), top.indices.numpy()
        if both:  # fold this block's best rows per column into the running column top-k
            col = torch.topk(cos.T, min(width_ba, len(cos)), dim=1)
            merged_cos = torch.cat([best_cos, col.values.T])
            merged_ids = torch.cat([best_ids, col.indices.T + start])
            keep = torch.topk(merged_cos, width_ba, dim=0)
            best_cos, best_ids = keep.values, torch.gather(merged_ids, 0, keep.indices)
    back = (best_ids.T.contiguous().numpy(), best_cos.T.contiguous().numpy()) if both else None
    return (ids_ab, cos_ab), back


def table_path(root: str | Path, source: str, target: str) -> Path:
    return AtlasLayout(root).root / "indexes" / "neighbours" / source / f"{target}.npy"


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _current(path: Path, source_sha: str, target_sha: str) -> dict[str, Any] | None:
    """The table's sidecar when it and the file match the two SAEs' weights, else None."""
    if not path.exists() or not _sidecar(path).exists():
        return None
    try:
        sidecar = read_json(_sidecar(path), "")
    except IntegrityError:
        return None
    if not isinstance(sidecar, dict):
        return None
    if (sidecar.get("source_weights_sha256"), sidecar.get("target_weights_sha256")) != (source_sha, target_sha):
        return None
    return sidecar if sha256_file(path) == sidecar.get("table_sha256") else None


def _save(root: str | Path, source: str, target: str, table: Table, shas: tuple[str, str], seconds: float) -> None:
    ids, cos = table
    width = ids.shape[1]
    record = np.empty(len(ids), dtype=[("latent", "<i4", (width,)), ("cosine", "<f4", (width,))])
    record["latent"], record["cosine"] = ids, cos
    path = table_path(root, source, target)
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.save(handle, record)
    atomic_write_json(_sidecar(path), {"source": source, "target": target, "rows": len(ids), "width": width,
                                       "source_weights_sha256": shas[0], "target_weights_sha256": shas[1],
                                       "table_sha256": sha256_file(path), "build_seconds": seconds})


def load_table(root: str | Path, source: str, target: str, source_sha: str, target_sha: str) -> Table | None:
    """A table written by `build_tables`, memory-mapped, when it is current and intact; else None."""
    path = table_path(root, source, target)
    if _current(path, source_sha, target_sha) is None:
        return None
    record = np.load(path, mmap_mode="r")
    return record["latent"], record["cosine"]


def build_tables(root: str | Path, decoders: dict[str, tuple[np.ndarray, str]], *, rebuild: bool = False) -> int:
    """Write the tables of every pair (both directions, self pairs included) of `decoders`
    (SAE id -> unit rows, weights sha256; one residual width) that is too large to compute
    on load; current ones are kept unless `rebuild`. Returns how many were written."""
    written = 0
    ids = list(decoders)
    for i, source in enumerate(ids):
        for target in ids[i:]:
            (a, sha_a), (b, sha_b) = decoders[source], decoders[target]
            if len(a) * len(b) <= TABLE_MAX_PAIRS:
                continue
            wanted = [(source, target, sha_a, sha_b), (target, source, sha_b, sha_a)][:1 if source == target else 2]
            if not rebuild and all(_current(table_path(root, s, t), x, y) for s, t, x, y in wanted):
                continue
            started = time.perf_counter()
            forward, back = nearest_rows(a, b, both=source != target)
            seconds = time.perf_counter() - started
            _save(root, source, target, forward, (sha_a, sha_b), seconds)
            if back is not None:
                _save(root, target, source, back, (sha_b, sha_a), seconds)
            written += len(wanted)
    return written
