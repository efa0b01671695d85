"""Per-feature records beside an SAE's summary tables: `saes/<id>/geometry.parquet` (which
geometry results a feature belongs to) and `saes/<id>/labels.parquet` (its offline label
and imported explanations).

Each table is written atomically with a sidecar `<name>.json` (written last) holding the
schema version, the file's sha256 and row count, and the sha256 of the SAE weights the
records were derived from; readers verify all three (a sidecar written before the weights
were recorded is accepted) and raise `IntegrityError` naming the file and the command that
rebuilds it. A table that was never written reads as empty. Record tables are written and
read under the SAE folder's `tables_lock`, the labels together with the summary tables they
were computed from (`store.tables.write_tables`), so a reader sees one whole summary.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl

from sae_atlas.errors import IntegrityError
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.frames import conform
from sae_atlas.store.integrity import check_weights_record, weights_record
from sae_atlas.store.layout import AtlasLayout, created_with
from sae_atlas.store.locks import tables_lock

RecordTable = Literal["geometry", "labels"]
RECORDS_SCHEMA_VERSION = 1
AUTO_LABELS = "auto"
"""The `source` of the offline labels in an SAE's labels table (imported sets are named)."""

GEOMETRY_SCHEMA: dict[str, pl.DataType] = {
    "sae_id": pl.String(),
    "latent": pl.Int64(),
    "kind": pl.String(),  # circle | concept | hierarchy | lobe
    "run": pl.String(),  # the analysis run it came from
    "group": pl.Int64(),  # cluster id, lobe id, or place in a concept span
    "name": pl.String(),  # concept / hierarchy node / cluster name
    "in_circle": pl.Boolean(),
    "period": pl.Float64(),  # fitted period of the circle (null when not measured)
    "score": pl.Float64(),  # the result's own quality score
}
LABELS_SCHEMA: dict[str, pl.DataType] = {
    "sae_id": pl.String(),
    "latent": pl.Int64(),
    "source": pl.String(),  # "auto" (computed offline) or the name of an imported explanation set
    "text": pl.String(),
}
SCHEMAS: dict[str, dict[str, pl.DataType]] = {"geometry": GEOMETRY_SCHEMA, "labels": LABELS_SCHEMA}
REPAIR = {"geometry": "re-run `sae-atlas search geometry {root} --rebuild`",
          "labels": "re-run `sae-atlas search labels {root} --rebuild`"}


def record_files(folder: Path, table: RecordTable) -> tuple[Path, Path]:
    """`(parquet, sidecar json)` of one record table in an SAE's folder."""
    return folder / f"{table}.parquet", folder / f"{table}.json"


def record_paths(root: str | Path, sae_id: str, table: RecordTable) -> tuple[Path, Path]:
    """`(parquet, sidecar json)` of one record table of an SAE (NotFoundError for an unknown id)."""
    return record_files(AtlasLayout(root).require_sae(sae_id), table)


def write_records(root: str | Path, sae_id: str, table: RecordTable, frame: pl.DataFrame) -> Path:
    """Write a record table (conformed to its schema) and then its sidecar, which records the
    SAE's current weights, under the exclusive `tables_lock`; returns the parquet path."""
    frame = conform(frame, SCHEMAS[table], f"{table} records of {sae_id}")
    path, sidecar = record_paths(root, sae_id, table)
    weights = weights_record(root, sae_id)
    with tables_lock(path.parent, "exclusive"):
        with atomic_path(path) as tmp:
            frame.write_parquet(tmp, compression="zstd")
        atomic_write_json(sidecar, {"schema_version": RECORDS_SCHEMA_VERSION, "table": table, "rows": frame.height,
                                    "sha256": sha256_file(path), **weights, "created_with": created_with()})
    return path


def read_records(root: str | Path, sae_id: str, table: RecordTable, *, check_weights: bool = True) -> pl.DataFrame:
    """A verified record table of an SAE (empty when never written), read under the shared
    `tables_lock`. With `check_weights` False, a table derived from other weights than the
    SAE's current ones is read too: only for a rewrite that replaces the derived rows
    (rebuilding the offline labels keeps the imported explanations)."""
    path, sidecar = record_paths(root, sae_id, table)
    with tables_lock(path.parent, "shared"):
        return _read_records(root, sae_id, table, path, sidecar, check_weights)


def _read_records(root: str | Path, sae_id: str, table: RecordTable, path: Path, sidecar: Path,
                  check_weights: bool) -> pl.DataFrame:
    repair = REPAIR[table].format(root=root)
    if not sidecar.exists():
        if path.exists():
            raise IntegrityError(sidecar, "is missing beside its table (an interrupted write)", repair)
        return pl.DataFrame(schema=SCHEMAS[table])
    meta = read_json(sidecar, repair)
    if not path.exists():
        raise IntegrityError(path, "is missing", repair)
    if sha256_file(path) != meta.get("sha256"):
        raise IntegrityError(path, "sha256 does not match its sidecar (corrupt or truncated)", repair)
    frame = pl.read_parquet(path)
    if frame.height != meta.get("rows"):
        raise IntegrityError(path, f"has {frame.height} rows; its sidecar says {meta.get('rows')}", repair)
    if check_weights:
        check_weights_record(root, sae_id, meta, path, repair)
    return frame


def update_labels(root: str | Path, sae_id: str, change: Callable[[pl.DataFrame], pl.DataFrame], *,
                  check_weights: bool = True) -> pl.DataFrame:
    """Replace an SAE's labels table by `change(current table)` holding the exclusive
    `tables_lock` from the read to the write (no other label or summary write in between);
    returns the table written. `check_weights` as in `read_records`."""
    path = record_paths(root, sae_id, "labels")[0]
    with tables_lock(path.parent, "exclusive"):
        frame = change(read_records(root, sae_id, "labels", check_weights=check_weights))
        write_records(root, sae_id, "labels", frame)
    return frame


def replace_auto_labels(root: str | Path, sae_id: str, labels: pl.DataFrame) -> None:
    """Store `labels` (columns latent, text) as the SAE's offline labels, first, keeping its
    imported explanations (also those stored beside labels of other weights)."""
    auto = conform(labels.select(pl.lit(sae_id).alias("sae_id"), "latent", pl.lit(AUTO_LABELS).alias("source"),
                                 "text"), LABELS_SCHEMA, f"offline labels of {sae_id}")
    update_labels(root, sae_id, lambda current: pl.concat([auto, current.filter(pl.col("source") != AUTO_LABELS)]),
                  check_weights=False)


PERIOD_TOLERANCE = 0.5  # a fitted period matches a wanted one within this distance


def geometry_mask(
    records: pl.DataFrame, n_latents: int, *, in_circle: bool | None = None, period: float | None = None,
    lobe: int | None = None,
) -> np.ndarray:
    """Which of an SAE's `n_latents` pass the geometry filters, from its geometry records:
    in a circle (`in_circle` True, or a `period` given: with a fitted period within
    `PERIOD_TOLERANCE` of it) or in none (`in_circle` False), and in lobe `lobe`."""
    mask = np.ones(n_latents, dtype=bool)
    if in_circle is not None or period is not None:
        circle = records.filter(pl.col("in_circle"))
        if period is not None:
            circle = circle.filter((pl.col("period") - period).abs() <= PERIOD_TOLERANCE)
        inside = np.zeros(n_latents, dtype=bool)
        inside[circle["latent"].to_numpy()] = True
        mask &= inside if in_circle is not False else ~inside
    if lobe is not None:
        members = np.zeros(n_latents, dtype=bool)
        members[records.filter((pl.col("kind") == "lobe") & (pl.col("group") == lobe))["latent"].to_numpy()] = True
        mask &= members
    return mask
