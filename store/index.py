"""The persistence layer of `index`; its other layers: `sae_atlas.api.commands.index` (CLI).

FAISS indexes over unit-normalised SAE decoder rows: one per SAE and one model-wide.

Below `approx_threshold` rows an index is exact (`IndexFlatIP`). Above it, an inverted-file
index with 4-bit product-quantized codes (`IndexIVFPQFastScan`) proposes candidates and
`IndexRefineFlat` re-ranks them by their exact cosine; its recall@10 against exact search
is measured on a seeded sample at build time and recorded. Each index file has a JSON sidecar with its type,
parameters, build time, recall, the sha256 of the index file and of the decoder weights it
was built from; loading checks both, so a corrupt or stale index is refused with the
command that rebuilds it. Indexes load memory-mapped where FAISS allows
(`_read_faiss`). Large exact indexes are searched by a certified 8-bit scan
(`store.int8_scan`) over the mapped rows, which returns the same top k. The model-wide
index (`indexes/model.faiss`) covers every SAE of the atlas' most common width; its sidecar
maps id ranges back to (SAE id, latent). An index build also writes the neighbour tables
of the SAE pairs too large to compute when a search process loads them
(`store.neighbour_tables`).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.hooks import cfg_hook_name, hook_layer
from sae_atlas.store.index_params import APPROX_THRESHOLD
from sae_atlas.store.int8_scan import Int8Scan
from sae_atlas.store.integrity import (
    WEIGHTS_FILE,
    WEIGHTS_SHA256,
    check_weights_record,
    sae_cfg,
    verify_sae_weights,
    weights_repair,
)
from sae_atlas.store.layout import AtlasLayout, created_with
from sae_atlas.store.locks import file_lock
from sae_atlas.store.neighbour_tables import build_tables
from sae_atlas.store.safetensors_io import MappedSafetensors

INT8_SCAN_THRESHOLD = 4096
SearchIndex = faiss.Index | Int8Scan  # what `load_index` returns: both have ntotal, d, search
RECALL_SAMPLE = 256
INDEX_LOCK_WAIT = 30.0  # seconds `load_index` waits for a `save_index` putting the same index in place
K_FACTORS = (8, 16, 32, 64)  # candidates re-ranked per result, tried while tuning


def rebuild_command(root: str | Path) -> str:
    return f"rebuild it with `sae-atlas index {root} --rebuild`"


@dataclass
class Decoder:
    """An SAE's unit decoder rows and what identifies them."""

    sae_id: str
    hook: str
    layer: int
    rows: np.ndarray  # [d_sae, d_in] unit rows
    weights_sha256: str


def read_decoder(root: str | Path, sae_id: str) -> Decoder:
    """Unit-normalised `W_dec` rows of an SAE folder (SAELens layout)."""
    sha = verify_sae_weights(root, sae_id)  # corrupt weights are named first, never indexed
    cfg = sae_cfg(root, sae_id)
    hook = cfg_hook_name(cfg)
    weights = AtlasLayout(root).sae_dir(sae_id) / WEIGHTS_FILE
    tensors = MappedSafetensors(weights, weights_repair(sae_id))
    rows = tensors.torch("W_dec").float().numpy()
    if rows.shape != (cfg.get("d_sae"), cfg.get("d_in")):
        raise IntegrityError(weights, f"W_dec has shape {rows.shape}, cfg.json says "
                             f"[{cfg.get('d_sae')}, {cfg.get('d_in')}]", weights_repair(sae_id))
    return Decoder(sae_id, hook, hook_layer(hook), unit_rows(rows), sha)


def build_index(vectors: np.ndarray, *, approx_threshold: int = APPROX_THRESHOLD, seed: int = 0,
                target_recall: float = 0.95) -> tuple[faiss.Index, dict[str, Any]]:
    """An inner-product index over unit `vectors` and its description (type, params, recall):
    exact below `approx_threshold` rows, else `_build_approximate`."""
    n, d = vectors.shape
    if n == 0:
        raise InvalidInputError("cannot index zero vectors")
    start = time.perf_counter()
    if n < approx_threshold:
        index: faiss.Index = faiss.IndexFlatIP(d)
        index.add(vectors)
        info: dict[str, Any] = {"type": "IndexFlatIP", "params": {}, "exact": True}
    else:
        index, info = _build_approximate(vectors, seed=seed, target_recall=target_recall)
    info["build_seconds"] = time.perf_counter() - start
    info["n"], info["d"] = n, d
    info.setdefault("recall_at_10", 1.0)
    return index, info


def pq_subquantizers(d: int) -> int:
    """Sub-quantizers of the 4-bit product quantizer: the most that divide `d` with at
    least 4 dimensions each (192 at d 768, 144 at d 576)."""
    return next(m for m in range(max(1, d // 4), 0, -1) if d % m == 0)


def _build_approximate(vectors: np.ndarray, *, seed: int, target_recall: float) -> tuple[faiss.Index, dict[str, Any]]:
    """IVF with 4-bit PQ fast-scan codes, candidates re-ranked exactly (`IndexRefineFlat`).

    About 4 sqrt(n) lists are trained by spherical k-means (10 iterations) on a seeded
    sample of 39 rows per list. A query scans the codes of `nprobe` lists, keeps
    `k_factor * k` candidates and re-scores them against the float rows. For each k_factor
    in `K_FACTORS`, `nprobe` doubles until the recall@10 measured against exact search
    reaches `target_recall`; the pair that reads the fewest bytes per query is kept (every
    list and the largest k_factor if none reaches it).
    """
    n, d = vectors.shape
    nlist = int(max(1, min(max(16, 4 * np.sqrt(n)), n // 39)))
    n_train = min(n, 39 * nlist)
    m = pq_subquantizers(d)
    base = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(d), d, nlist, m, 4, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(seed)
    sample = vectors[np.sort(rng.choice(n, size=n_train, replace=False))]
    base.cp.seed = seed
    base.cp.niter = 10
    base.cp.spherical = True
    base.train(sample)
    del sample
    index = faiss.IndexRefineFlat(base)
    index.add(vectors)
    queries, truth = recall_probe(vectors, seed=seed)
    first = max(1, nlist // 64)
    best: tuple[float, int, int, float] | None = None  # (cost, nprobe, k_factor, recall)
    for k_factor in K_FACTORS:
        index.k_factor = k_factor
        base.nprobe = first
        recall = recall_against(index, queries, truth)
        while recall < target_recall and base.nprobe < nlist:
            base.nprobe = min(nlist, base.nprobe * 2)
            recall = recall_against(index, queries, truth)
        # bytes a query reads: the codes of the probed lists, then the re-ranked float rows
        cost = base.nprobe * (n / nlist) * m / 2 + k_factor * 10 * d * 4
        if recall >= target_recall and (best is None or cost < best[0]):
            best = (cost, base.nprobe, k_factor, recall)
        if best is not None and base.nprobe == first:
            break  # more candidates cannot make it cheaper
    _, base.nprobe, index.k_factor, recall = best or (0.0, nlist, K_FACTORS[-1], recall)
    params = {"nlist": nlist, "nprobe": base.nprobe, "pq_subquantizers": m, "pq_bits": 4,
              "k_factor": int(index.k_factor), "train_rows": n_train, "kmeans_iter": 10, "spherical": True}
    return index, {"type": "IndexRefineFlat(IndexIVFPQFastScan)", "params": params, "exact": False,
                   "recall_at_10": recall, "recall_queries": len(queries)}


def recall_probe(vectors: np.ndarray, *, k: int = 10, seed: int = 0,
                 sample: int = RECALL_SAMPLE) -> tuple[np.ndarray, np.ndarray]:
    """Seeded perturbed sample rows as queries, and their exact top-`k` ids over `vectors`."""
    rng = np.random.default_rng(seed + 1)
    picks = np.sort(rng.choice(len(vectors), size=min(sample, len(vectors)), replace=False))
    noise = rng.standard_normal((len(picks), vectors.shape[1])).astype(np.float32)
    queries = unit_rows(vectors[picks] + 0.05 * noise / np.sqrt(vectors.shape[1]))
    _, truth = faiss.knn(queries, np.ascontiguousarray(vectors, dtype=np.float32), min(k, len(vectors)),
                         metric=faiss.METRIC_INNER_PRODUCT)
    return queries, truth


def recall_against(index: faiss.Index, queries: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of each query's exact neighbours (`truth` rows) that `index` returns."""
    _, found = index.search(queries, truth.shape[1])
    hits = [len(set(t) & set(f)) for t, f in zip(truth.tolist(), found.tolist(), strict=True)]
    return float(np.mean(hits) / truth.shape[1])


def index_lock_path(path: Path) -> Path:
    """The lock file of the index at `path` and its sidecar (`.<name>.lock` beside them)."""
    return path.with_name(f".{path.name}.lock")


def save_index(index: faiss.Index, info: dict[str, Any], path: Path, extra: dict[str, Any]) -> None:
    """Write the index atomically plus its sidecar (`<name>.json`) with checksums. The index
    is written and hashed beside its place first; putting both in place holds the index's
    exclusive lock (`load_index` reads them under its shared one)."""
    with contextlib.ExitStack() as installing:
        with atomic_path(path) as tmp:  # renamed into place on leaving, under the lock below
            faiss.write_index(index, str(tmp))
            sidecar = {**info, **extra, "index_sha256": sha256_file(tmp), "created_with": created_with()}
            installing.enter_context(file_lock(index_lock_path(path), "exclusive"))
        atomic_write_json(path.with_suffix(".json"), sidecar)


def load_index(path: Path, root: str | Path, expected: dict[str, str], *,
               scan_threshold: int = INT8_SCAN_THRESHOLD) -> tuple[SearchIndex, dict[str, Any]]:
    """Read a saved index after checking its sidecar, checksum and source weights.

    `expected` maps sidecar keys (e.g. `weights_sha256`) to the values the current atlas
    has; a difference means the index is stale. An exact index of `scan_threshold` rows or
    more is searched through `Int8Scan` (same results, a quarter of the bytes per query).
    The pair is read under the index's shared lock, so a `save_index` in progress is waited
    for (up to `INDEX_LOCK_WAIT` seconds; then the checks below name a torn pair).
    """
    with file_lock(index_lock_path(path), "shared", wait=INDEX_LOCK_WAIT):
        return _load_index(path, root, expected, scan_threshold)


def _load_index(path: Path, root: str | Path, expected: dict[str, str],
                scan_threshold: int) -> tuple[SearchIndex, dict[str, Any]]:
    repair = rebuild_command(root)
    if not path.exists():
        raise IntegrityError(path, "index file is missing", repair)
    sidecar = read_json(path.with_suffix(".json"), repair)
    if sha256_file(path) != sidecar.get("index_sha256"):
        raise IntegrityError(path, "sha256 does not match its sidecar (corrupt or truncated index)", repair)
    for key, value in expected.items():
        if sidecar.get(key) != value:
            raise IntegrityError(path, f"index is stale: derived from other SAE weights ({key} differs)", repair)
    index, mapped = _read_faiss(path, sidecar.get("type"), repair)
    sidecar["mmap"] = mapped
    params = sidecar.get("params", {})
    if "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]
    if "k_factor" in params:
        faiss.downcast_index(index).k_factor = params["k_factor"]
    if sidecar.get("type") == "IndexFlatIP" and index.ntotal >= scan_threshold:
        rows = faiss.rev_swig_ptr(faiss.downcast_index(index).get_xb(), index.ntotal * index.d)
        scan = Int8Scan(np.asarray(rows).reshape(index.ntotal, index.d), owner=index)
        sidecar["scan"] = "int8, certified bounds, float32 re-scoring"
        return scan, sidecar
    return index, sidecar


def _read_faiss(path: Path, kind: str | None, repair: str) -> tuple[faiss.Index, bool]:
    """Read an index memory-mapped where faiss-cpu 1.15 supports it, else into memory.

    `IO_FLAG_MMAP_IFC` maps the float rows of flat indexes and of re-ranked IVF-PQ indexes
    (the bulk of the file; the 4-bit codes are read). Any other type is read whole.
    """
    flag = {"IndexFlatIP": faiss.IO_FLAG_MMAP_IFC,
            "IndexRefineFlat(IndexIVFPQFastScan)": faiss.IO_FLAG_MMAP_IFC}.get(kind or "")
    if flag is not None:
        try:
            return faiss.read_index(str(path), flag), True
        except RuntimeError:
            pass
    try:
        return faiss.read_index(str(path)), False
    except RuntimeError as exc:
        raise IntegrityError(path, f"FAISS cannot read the index ({exc})", repair) from exc


def sae_index_path(root: str | Path, sae_id: str) -> Path:
    return AtlasLayout(root).sae_dir(sae_id) / "index.faiss"


def check_index_weights(root: str | Path, sae_id: str) -> None:
    """IntegrityError naming the SAE's own index when its sidecar records other weights than
    the SAE's current ones (nothing when no index was built): checked for every SAE the
    model-wide index covers, so a search over it names the SAE whose weights changed."""
    path = sae_index_path(root, sae_id)
    if path.with_suffix(".json").exists():
        check_weights_record(root, sae_id, read_json(path.with_suffix(".json"), rebuild_command(root)), path,
                             rebuild_command(root))


def index_built(path: Path) -> bool:
    """Whether an index was built at `path`: the file or its sidecar exists. A sidecar
    without its index file is damage (`load_index` names it), not "no index yet"."""
    return path.exists() or path.with_suffix(".json").exists()


def model_index_path(root: str | Path) -> Path:
    return AtlasLayout(root).root / "indexes" / "model.faiss"


def model_members(root: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """SAE ids the model-wide index covers (those of the most common width, the wider on a
    tie), and the excluded SAEs with their width."""
    layout = AtlasLayout(root)
    widths = {sae_id: int(sae_cfg(root, sae_id)["d_in"]) for sae_id in layout.sae_ids()}
    counts: dict[int, int] = {}
    for d in widths.values():
        counts[d] = counts.get(d, 0) + 1
    width = max(counts, key=lambda d: (counts[d], d), default=0)
    members = [sae_id for sae_id, d in widths.items() if d == width]
    return members, [{"sae_id": sae_id, "d": d} for sae_id, d in widths.items() if d != width]


def build_marker_path(root: str | Path) -> Path:
    """`indexes/build.json`: present while an index build runs (left behind by a kill)."""
    return AtlasLayout(root).root / "indexes" / "build.json"


def build_lock_path(root: str | Path) -> Path:
    """`indexes/.build.lock`: held exclusively by the running index build."""
    return AtlasLayout(root).root / "indexes" / ".build.lock"


def check_build_complete(root: str | Path) -> None:
    """IntegrityError when an index build was interrupted (its marker is there and no build
    holds its lock): its indexes may mix exact and approximate types, or cover other SAE
    sets, until the build is run again. A build still running is not an error: each index
    it replaces is read whole, old or new (`load_index`). Never waits."""
    marker = build_marker_path(root)
    if not marker.exists():
        return
    with file_lock(build_lock_path(root), "shared", wait=0) as builder_gone:
        if builder_gone and marker.exists():
            started = read_json(marker, rebuild_command(root))
            raise IntegrityError(marker, "an index build was interrupted, so the indexes may mix exact and "
                                 "approximate types", f"re-run `sae-atlas index {root} --approx-threshold "
                                 f"{started.get('approx_threshold', APPROX_THRESHOLD)}`")


def build_atlas_indexes(root: str | Path, sae_ids: list[str] | None = None, *, rebuild: bool = False,
                        approx_threshold: int = APPROX_THRESHOLD, seed: int = 0) -> list[dict[str, Any]]:
    """Build (or keep, when current) every SAE's index and the model-wide index.

    The model-wide index covers every SAE of the atlas' most common residual width
    (`model_members`), whatever `sae_ids` selects. Every SAE's weights are verified before
    anything is written, so corrupt weights are refused, not indexed. An index is kept only
    when it verifies and is of the type `approx_threshold` asks for (exact below it); while
    the build runs, `indexes/build.json` marks it unfinished and the build holds
    `indexes/.build.lock` exclusively (`check_build_complete`), so a killed build is re-run
    rather than served half old, half new, and one still running is not taken for killed.
    Returns the sidecars of the indexes, with `"rebuilt"` telling which were (re)written.
    """
    layout = AtlasLayout(root)
    ids = sae_ids or layout.sae_ids()
    if not ids:
        raise InvalidInputError(f"{root} has no SAEs to index; train one with `sae-atlas train --atlas {root}`")
    members, excluded = model_members(root)
    for sae_id in dict.fromkeys([*ids, *members]):
        verify_sae_weights(root, sae_id)
    marker = build_marker_path(root)
    marker.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(build_lock_path(root), "exclusive"):
        atomic_write_json(marker, {"approx_threshold": approx_threshold, "seed": seed, "rebuild": rebuild,
                                   "started": time.time()})
        out = [_ensure_sae_index(root, sae_id, rebuild, approx_threshold, seed) for sae_id in ids]
        out.append(_ensure_model_index(root, members, excluded, rebuild, approx_threshold, seed))
        _build_neighbour_tables(root, rebuild)
        marker.unlink()
    return out


def _ensure_sae_index(root: str | Path, sae_id: str, rebuild: bool, approx_threshold: int,
                      seed: int) -> dict[str, Any]:
    dec = read_decoder(root, sae_id)
    return _ensure(sae_index_path(root, sae_id), root, dec.rows,
                   {"sae_id": sae_id, "hook": dec.hook, "layer": dec.layer, WEIGHTS_SHA256: dec.weights_sha256},
                   rebuild, approx_threshold, seed)


def _ensure_model_index(root: str | Path, members: list[str], excluded: list[dict[str, Any]], rebuild: bool,
                        approx_threshold: int, seed: int) -> dict[str, Any]:
    offsets, parts, start = [], [], 0
    for sae_id in members:
        dec = read_decoder(root, sae_id)
        offsets.append({"sae_id": sae_id, "hook": dec.hook, "layer": dec.layer, "start": start,
                        "count": len(dec.rows), WEIGHTS_SHA256: dec.weights_sha256})
        parts.append(dec.rows)
        start += len(dec.rows)
    rows = np.concatenate(parts)
    del parts
    return _ensure(model_index_path(root), root, rows,
                   {"saes": offsets, "excluded": excluded, WEIGHTS_SHA256: combined_weights_sha256(offsets)},
                   rebuild, approx_threshold, seed)


def _build_neighbour_tables(root: str | Path, rebuild: bool) -> None:
    """The neighbour tables too large to compute on load, for every group of SAEs of one width."""
    widths: dict[int, list[str]] = {}
    for sae_id in AtlasLayout(root).sae_ids():
        widths.setdefault(int(sae_cfg(root, sae_id)["d_in"]), []).append(sae_id)
    for group in widths.values():
        decoders = {sae_id: (dec.rows, dec.weights_sha256) for sae_id in group
                    for dec in [read_decoder(root, sae_id)]}
        build_tables(root, decoders, rebuild=rebuild)


def combined_weights_sha256(offsets: list[dict[str, Any]]) -> str:
    """One checksum over the (SAE id, weights sha256) pairs a model-wide index covers."""
    return hashlib.sha256("".join(f"{o['sae_id']}:{o[WEIGHTS_SHA256]};" for o in offsets).encode()).hexdigest()


def _ensure(path: Path, root: str | Path, rows: np.ndarray, extra: dict[str, Any], rebuild: bool,
            approx_threshold: int, seed: int) -> dict[str, Any]:
    if not rebuild:
        try:
            _, sidecar = load_index(path, root, {WEIGHTS_SHA256: extra[WEIGHTS_SHA256]})
            if sidecar.get("exact") == (len(rows) < approx_threshold):
                return {**sidecar, "path": str(path), "rebuilt": False}
        except IntegrityError:
            pass
    index, info = build_index(rows, approx_threshold=approx_threshold, seed=seed)
    save_index(index, info, path, extra)
    return {**info, **extra, "path": str(path), "rebuilt": True}
