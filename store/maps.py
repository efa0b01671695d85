"""The persistence layer of `maps`; its other layers: `sae_atlas.api.analyses.maps` (analysis-run),
`sae_atlas.geometry.maps` (maths).

The persistence layer of the feature maps (the maths is `sae_atlas.geometry.maps`): an
SAE's map is stored per feature in `saes/<sae_id>/map.parquet` (columns latent, x, y,
knn_overlap, then cooc_x, cooc_y, cooc_knn_overlap when the co-occurrence map was built,
then any attached cluster-label columns) with a `map.json` sidecar (parameters, per-basis
scores, checksum, the sha256 of the SAE weights the map was made from, created_with).
Reading a map made from other weights than the SAE's current ones is refused (a sidecar
written before the weights were recorded is accepted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.geometry.maps import FeatureMap
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.integrity import check_weights_record, weights_record
from sae_atlas.store.layout import AtlasLayout, created_with

MAP_FILE, MAP_META = "map.parquet", "map.json"
BASE_COLUMNS = ("latent", "x", "y", "knn_overlap")
COOC_COLUMNS = ("cooc_x", "cooc_y", "cooc_knn_overlap")
Basis = Literal["decoder", "cooccurrence"]
BASIS_COLUMNS: dict[str, tuple[str, str, str]] = {"decoder": BASE_COLUMNS[1:], "cooccurrence": COOC_COLUMNS}
RESERVED_COLUMNS = BASE_COLUMNS + COOC_COLUMNS


def map_frame(fmap: FeatureMap, labels: dict[str, np.ndarray] | None = None, *,
              cooccurrence: FeatureMap | None = None) -> pl.DataFrame:
    """The per-feature map table: latent, x, y, knn_overlap, the co-occurrence map's
    cooc_x, cooc_y, cooc_knn_overlap when given, then one column per label set."""
    n = len(fmap.coords_F2)
    columns = {"latent": np.arange(n, dtype=np.int32), "x": fmap.coords_F2[:, 0], "y": fmap.coords_F2[:, 1],
               "knn_overlap": fmap.overlap_F.astype(np.float32)}
    if cooccurrence is not None:
        columns |= dict(zip(COOC_COLUMNS, (cooccurrence.coords_F2[:, 0], cooccurrence.coords_F2[:, 1],
                                           cooccurrence.overlap_F.astype(np.float32)), strict=True))
    frame = pl.DataFrame(columns).with_columns(pl.col(pl.Float32).fill_nan(None))  # no score: null, not NaN
    return with_labels(frame, labels or {})


def stored_summary(maps: dict[str, FeatureMap]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parameters and summary for `map.json`: the decoder map's at the top level, the
    co-occurrence map's (when built) under "cooccurrence"."""
    params, summary = dict(maps["decoder"].params), dict(maps["decoder"].summary)
    if "cooccurrence" in maps:
        params["cooccurrence"], summary["cooccurrence"] = maps["cooccurrence"].params, maps["cooccurrence"].summary
    return params, summary


def basis_frame(frame: pl.DataFrame, basis: Basis) -> pl.DataFrame:
    """One basis of a stored map table as latent, x, y, knn_overlap and the label columns;
    NotFoundError when that basis was not built."""
    if basis not in BASIS_COLUMNS:
        raise InvalidInputError(f"unknown map basis {basis!r}; valid: {', '.join(BASIS_COLUMNS)}")
    x, y, overlap = BASIS_COLUMNS[basis]
    if x not in frame.columns:
        raise NotFoundError(f"this map has no {basis} basis; build it with `sae-atlas analyze map` after "
                            "`sae-atlas summarize` (the co-occurrence map needs the occurrence matrix)")
    labels = [c for c in frame.columns if c not in RESERVED_COLUMNS]
    return frame.select("latent", pl.col(x).alias("x"), pl.col(y).alias("y"), pl.col(overlap).alias("knn_overlap"),
                        *labels)


def map_scores(frame: pl.DataFrame, meta: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per built basis: its mean kNN overlap on its own neighbours, chance level, and the
    mean share of the other basis' neighbours it keeps (None where not measured)."""
    summary = meta.get("summary") or {}
    sources = {"decoder": summary, "cooccurrence": summary.get("cooccurrence") or {}}
    return {basis: {key: sources[basis].get(key) for key in ("knn_overlap_mean", "chance", "other_basis_overlap_mean")}
            for basis, (x, _, _) in BASIS_COLUMNS.items() if x in frame.columns}


def with_labels(frame: pl.DataFrame, labels: dict[str, np.ndarray]) -> pl.DataFrame:
    """`frame` with label columns added or replaced (one int64 label per feature; -1 = none)."""
    for name, values in labels.items():
        if name in RESERVED_COLUMNS:
            raise InvalidInputError(f"label column name {name!r} is reserved; pick another")
        arr = np.asarray(values, dtype=np.int64)
        if arr.shape != (frame.height,):
            raise InvalidInputError(f"labels {name!r} must have one entry per feature ({frame.height}), got {arr.shape}")
        frame = frame.with_columns(pl.Series(name, arr))
    return frame


def _repair(root: str | Path, sae_id: str) -> str:
    return f"re-run `sae-atlas analyze map {root} --sae {sae_id}`"


def write_map(root: str | Path, sae_id: str, frame: pl.DataFrame, params: dict[str, Any],
              summary: dict[str, Any] | None = None) -> Path:
    """Write `map.parquet` then its `map.json` sidecar (recording the SAE's current weights)
    atomically; return the parquet path."""
    missing = [c for c in BASE_COLUMNS if c not in frame.columns]
    if missing:
        raise InvalidInputError(f"map table lacks columns {missing}")
    folder = AtlasLayout(root).require_sae(sae_id)
    path = folder / MAP_FILE
    weights = weights_record(root, sae_id)
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp, compression="zstd")
    atomic_write_json(folder / MAP_META, {
        "sae_id": sae_id, "sha256": sha256_file(path), "rows": frame.height, "params": params,
        "summary": summary or {}, "label_columns": [c for c in frame.columns if c not in RESERVED_COLUMNS],
        **weights, "created_with": created_with()})
    return path


def read_map(root: str | Path, sae_id: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The verified map table of an SAE and its sidecar (IntegrityError when either is
    missing or damaged, or the map was made from other weights than the SAE's current ones)."""
    folder = AtlasLayout(root).require_sae(sae_id)
    meta = read_json(folder / MAP_META, _repair(root, sae_id))
    path = folder / MAP_FILE
    if not path.exists() or sha256_file(path) != meta.get("sha256"):
        raise IntegrityError(path, "missing or its sha256 does not match map.json", _repair(root, sae_id))
    check_weights_record(root, sae_id, meta, path, _repair(root, sae_id))
    return pl.read_parquet(path), meta


def attach_labels(root: str | Path, sae_id: str, labels: dict[str, np.ndarray]) -> Path:
    """Add (or replace) cluster-label columns of a stored map, e.g. lobes or circular clusters."""
    frame, meta = read_map(root, sae_id)
    return write_map(root, sae_id, with_labels(frame, labels), meta["params"], meta.get("summary"))
