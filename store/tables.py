"""Feature summary tables of one SAE: `features.parquet`, `examples.parquet`, `occurrence.npz`.

The schemas (polars dtypes) are defined here and described column by column in
`store/SCHEMAS.md`. Files are written atomically; the sidecar `tables.json`, written
last, records the schema version, each file's sha256 and row count, the parameters of
the summary and the sha256 of the SAE weights it was computed from. Readers verify all of
it (tables of other weights are stale: `store.integrity.check_weights_record`; a sidecar
written before the weights were recorded is accepted) and raise `IntegrityError` naming
the file and the command that rebuilds it. The tables, their sidecar and the offline labels
computed from them are written under the SAE folder's exclusive `store.locks.tables_lock`
and read under its shared one, so a reader sees one whole summary. `FeatureTables` loads
both tables once and answers single-latent lookups by row offsets.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.feature_records import replace_auto_labels
from sae_atlas.store.frames import conform
from sae_atlas.store.integrity import check_weights_record, weights_record
from sae_atlas.store.layout import AtlasLayout, created_with
from sae_atlas.store.locks import tables_lock

TABLES_FORMAT = "sae-atlas-feature-tables"
TABLES_SCHEMA_VERSION = 1
TABLES_FILE = "tables.json"
FEATURES_FILE = "features.parquet"
EXAMPLES_FILE = "examples.parquet"
OCCURRENCE_FILE = "occurrence.npz"
PENDING_OCCURRENCE = ".pending-occurrence.npz"  # finished by OccurrenceWriter, installed by write_tables
_SPOOL_PREFIX = ".occurrence-"

FEATURES_SCHEMA: dict[str, pl.DataType] = {
    "latent": pl.Int32(),
    "n_active": pl.Int64(),
    "density": pl.Float64(),
    "mean_act": pl.Float32(),
    "mean_active_act": pl.Float32(),
    "max_act": pl.Float32(),
    "quantiles": pl.List(pl.Float32()),
    "hist_top": pl.Float32(),
    "hist_counts": pl.List(pl.Int64()),
    "decoder_norm": pl.Float32(),
    "top_logit_ids": pl.List(pl.Int32()),
    "top_logit_values": pl.List(pl.Float32()),
    "top_logit_tokens": pl.List(pl.String()),
    "bottom_logit_ids": pl.List(pl.Int32()),
    "bottom_logit_values": pl.List(pl.Float32()),
    "bottom_logit_tokens": pl.List(pl.String()),
}

EXAMPLES_SCHEMA: dict[str, pl.DataType] = {
    "latent": pl.Int32(),
    "kind": pl.String(),
    "band": pl.Int16(),
    "band_lo": pl.Float32(),
    "band_hi": pl.Float32(),
    "rank": pl.Int32(),
    "act": pl.Float32(),
    "token_id": pl.Int32(),
    "block": pl.Int64(),
    "pos": pl.Int32(),
    "doc_id": pl.Int64(),
    "centre": pl.Int32(),
    "token_ids": pl.List(pl.Int32()),
    "acts": pl.List(pl.Float32()),
    "tokens": pl.List(pl.String()),
}

SCHEMAS = {FEATURES_FILE: FEATURES_SCHEMA, EXAMPLES_FILE: EXAMPLES_SCHEMA}


def summarize_repair(root: str | Path, sae_id: str) -> str:
    """The command that rebuilds an SAE's summary tables."""
    return f"re-run `sae-atlas summarize {root} --sae {sae_id}`"


def histogram_edges(hist_top: float, n_bins: int, bins_per_octave: int) -> np.ndarray:
    """Edges `[n_bins + 1]` of a latent's log histogram: `hist_top * 2**((j - n_bins) / bpo)`.

    Column `hist_counts` has `n_bins + 1` entries: entry 0 counts activations in
    `(0, edges[0])`, entry j >= 1 counts `[edges[j-1], edges[j])`.
    """
    j = np.arange(n_bins + 1, dtype=np.float64)
    return hist_top * np.exp2((j - n_bins) / bins_per_octave)


def padded_list(
    name: str,
    flat: np.ndarray | pl.Series,
    width: int,
    inner: pl.DataType,
    start: np.ndarray | None = None,
    length: np.ndarray | None = None,
) -> pl.Series:
    """A list column from row-major padded values `[n * width]`: row i holds its `width`
    values, or `length[i]` of them from `start[i]` when given (vectorised, no Python loop)."""
    series = flat if isinstance(flat, pl.Series) else pl.Series(name, flat)
    lists = series.reshape((len(series) // width, width)).cast(pl.List(inner)).alias(name)
    if start is None or length is None:
        return lists
    frame = pl.DataFrame({name: lists, "_start": np.asarray(start, np.int64), "_length": np.asarray(length, np.int64)})
    return frame.select(pl.col(name).list.slice(pl.col("_start"), pl.col("_length"))).to_series()


# writing ----------------------------------------------------------------------------------
def _write_parquet(frame: pl.DataFrame, path: Path, table: str) -> dict[str, Any]:
    with atomic_path(path) as tmp:
        frame.write_parquet(
            tmp,
            compression="zstd",
            metadata={"sae_atlas_table": table, "schema_version": str(TABLES_SCHEMA_VERSION)},
        )
    return {"sha256": sha256_file(path), "rows": frame.height}


def write_tables(
    root: str | Path,
    sae_id: str,
    features: pl.DataFrame,
    examples: pl.DataFrame,
    params: dict[str, Any],
    *,
    labels: pl.DataFrame | None = None,
) -> dict[str, Any]:
    """Write both tables atomically (the occurrence file must already be written: a
    finished `OccurrenceWriter` is installed here), then the sidecar `tables.json` with
    checksums and the sha256 of the SAE's current weights; return the sidecar. `labels`
    (columns latent, text), the offline labels computed from these tables, replace the
    SAE's stored ones after the tables and before the sidecar. All of it happens under the
    exclusive `tables_lock`, so readers never see a new table with an old sidecar or new
    statistics with old labels, and a write killed before the sidecar is named as damage.
    Features must have one row per latent in order; examples are sorted by (latent, band,
    rank) for offset lookups."""
    sae_dir = AtlasLayout(root).sae_dir(sae_id)
    features = conform(features, FEATURES_SCHEMA, FEATURES_FILE)
    if not np.array_equal(features["latent"].to_numpy(), np.arange(features.height)):
        raise InvalidInputError(f"{FEATURES_FILE}: rows must be latents 0..{features.height - 1} in order")
    examples = conform(examples, EXAMPLES_SCHEMA, EXAMPLES_FILE).sort(
        ["latent", "band", "rank"], nulls_last=False, maintain_order=True
    )
    occurrence, pending = sae_dir / OCCURRENCE_FILE, sae_dir / PENDING_OCCURRENCE
    if not (occurrence.exists() or pending.exists()):
        raise InvalidInputError(f"{occurrence} must be written (finish the OccurrenceWriter) before the tables")
    weights = weights_record(root, sae_id)
    with tables_lock(sae_dir, "exclusive"):
        if pending.exists():
            os.replace(pending, occurrence)
        files = {
            FEATURES_FILE: _write_parquet(features, sae_dir / FEATURES_FILE, "features"),
            EXAMPLES_FILE: _write_parquet(examples, sae_dir / EXAMPLES_FILE, "examples"),
            OCCURRENCE_FILE: {"sha256": sha256_file(occurrence)},
        }
        if labels is not None:
            replace_auto_labels(root, sae_id, labels)
        sidecar = {
            "format": TABLES_FORMAT,
            "schema_version": TABLES_SCHEMA_VERSION,
            "sae_id": sae_id,
            "files": files,
            "params": params,
            **weights,
            "created_with": created_with(),
        }
        atomic_write_json(sae_dir / TABLES_FILE, sidecar)
    return sidecar


def remove_stale_files(folder: Path) -> list[Path]:
    """Delete what a killed summary left in an SAE folder (occurrence spool files, an
    uninstalled occurrence matrix, temporary table files); return the removed paths."""
    stale = [p for p in folder.iterdir() if p.name.startswith(_SPOOL_PREFIX) or p.name == PENDING_OCCURRENCE
             or any(p.name.startswith(f".{name}.") and p.name.endswith(".tmp")
                    for name in (FEATURES_FILE, EXAMPLES_FILE, OCCURRENCE_FILE, PENDING_OCCURRENCE, TABLES_FILE))]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class OccurrenceWriter:
    """Streams the CSR `[blocks x d_sae]` occurrence matrix to disk with O(1) memory.

    Row r is the r-th summarised block; entry (r, i) is the number of tokens of that block
    on which latent i fired. Indices and counts are spooled to temporary files and
    assembled by `finish()` into a pending matrix that `write_tables` installs as
    `occurrence.npz` (which `scipy.sparse.load_npz` reads) together with the tables. A new
    writer first removes what a killed run left behind (`remove_stale_files`).
    """

    def __init__(self, root: str | Path, sae_id: str, d_sae: int) -> None:
        folder = AtlasLayout(root).sae_dir(sae_id)
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale_files(folder)
        self.path = folder / PENDING_OCCURRENCE
        self.d_sae = d_sae
        self._spool = {
            name: tempfile.NamedTemporaryFile(prefix=f"{_SPOOL_PREFIX}{name}.", dir=folder, delete=False)
            for name in ("indices", "data", "rows")
        }
        self._nnz = 0
        self._n_rows = 0

    def append(self, block_index: np.ndarray, counts_nF: np.ndarray) -> None:
        """Add rows: `counts_nF[j, i]` tokens of block `block_index[j]` fired latent i."""
        rows, cols = np.nonzero(counts_nF)
        per_row = np.bincount(rows, minlength=len(counts_nF)).astype(np.int64)
        self._spool["indices"].write(cols.astype(np.int32).tobytes())
        self._spool["data"].write(counts_nF[rows, cols].astype(np.int32).tobytes())
        pairs = np.stack([np.asarray(block_index, dtype=np.int64), per_row], axis=1)
        self._spool["rows"].write(pairs.tobytes())
        self._nnz += len(cols)
        self._n_rows += len(counts_nF)

    def _mapped(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        self._spool[name].flush()
        if shape[0] == 0:
            return np.zeros(shape, dtype=dtype)
        return np.memmap(self._spool[name].name, dtype=dtype, mode="r", shape=shape)

    def finish(self) -> Path:
        """Write the pending occurrence matrix atomically from the spooled rows (installed
        by `write_tables`), remove the spool, and return the matrix's path."""
        try:
            rows = np.array(self._mapped("rows", np.int64, (self._n_rows, 2)))
            indptr = np.concatenate([[0], np.cumsum(rows[:, 1])]).astype(np.int64)
            with atomic_path(self.path) as tmp, open(tmp, "wb") as handle:
                np.savez(
                    handle,
                    format=np.array("csr"),
                    shape=np.array([self._n_rows, self.d_sae], dtype=np.int64),
                    indptr=indptr,
                    indices=self._mapped("indices", np.int32, (self._nnz,)),
                    data=self._mapped("data", np.int32, (self._nnz,)),
                    block_index=rows[:, 0],
                )
        finally:
            self.close()
        return self.path

    def close(self) -> None:
        """Remove the spool files (also on failure)."""
        for handle in self._spool.values():
            handle.close()
            if os.path.exists(handle.name):
                os.unlink(handle.name)


# reading ----------------------------------------------------------------------------------
def read_sidecar(root: str | Path, sae_id: str) -> dict[str, Any]:
    """The validated `tables.json` of an SAE: NotFoundError when the SAE was not summarized,
    IntegrityError when it is missing beside its tables, corrupt, outdated or derived from
    other weights than the SAE's current ones."""
    repair = summarize_repair(root, sae_id)
    folder = AtlasLayout(root).require_sae(sae_id)
    path = folder / TABLES_FILE
    if not path.exists():
        present = [name for name in (FEATURES_FILE, EXAMPLES_FILE, OCCURRENCE_FILE) if (folder / name).exists()]
        if present:
            raise IntegrityError(path, f"file is missing while {', '.join(present)} exist", repair)
        raise NotFoundError(f"SAE {sae_id!r} has no feature summary tables yet; run `sae-atlas summarize "
                            f"--atlas {root} --sae {sae_id}`")
    sidecar = read_json(path, repair)
    if not isinstance(sidecar, dict) or sidecar.get("format") != TABLES_FORMAT:
        raise IntegrityError(path, "not a feature-tables sidecar", repair)
    if sidecar.get("schema_version") != TABLES_SCHEMA_VERSION:
        raise IntegrityError(
            path,
            f"written with table schema version {sidecar.get('schema_version')}, "
            f"this sae-atlas reads version {TABLES_SCHEMA_VERSION}",
            repair,
        )
    for name in (FEATURES_FILE, EXAMPLES_FILE, OCCURRENCE_FILE):
        if "sha256" not in sidecar.get("files", {}).get(name, {}):
            raise IntegrityError(path, f"no checksum recorded for {name}", repair)
    check_weights_record(root, sae_id, sidecar, path, repair)
    return sidecar


def _verified_path(root: str | Path, sae_id: str, name: str, sidecar: dict[str, Any]) -> Path:
    path = AtlasLayout(root).sae_dir(sae_id) / name
    repair = summarize_repair(root, sae_id)
    if not path.exists():
        raise IntegrityError(path, "file is missing", repair)
    if sha256_file(path) != sidecar["files"][name]["sha256"]:
        raise IntegrityError(path, "sha256 does not match tables.json (corrupt or truncated)", repair)
    return path


@contextlib.contextmanager
def _snapshot(root: str | Path, sae_id: str) -> Iterator[dict[str, Any]]:
    """The sidecar, read under the shared `tables_lock` held while the caller reads the
    files it describes (so no summary is replaced in between)."""
    folder = AtlasLayout(root).require_sae(sae_id)
    with tables_lock(folder, "shared"):
        yield read_sidecar(root, sae_id)


def read_table(root: str | Path, sae_id: str, name: str, sidecar: dict[str, Any] | None = None) -> pl.DataFrame:
    """`features.parquet` or `examples.parquet` of an SAE, verified against its checksum and
    schema (against `sidecar` when given, else one read under the summary's shared lock)."""
    if name not in SCHEMAS:
        raise InvalidInputError(f"unknown table {name!r}; valid: {', '.join(SCHEMAS)}")
    if sidecar is None:
        with _snapshot(root, sae_id) as current:
            return read_table(root, sae_id, name, current)
    path = _verified_path(root, sae_id, name, sidecar)
    repair = summarize_repair(root, sae_id)
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # polars raises several error types for unreadable parquet
        raise IntegrityError(path, f"not a readable parquet file ({exc})", repair) from exc
    expected = SCHEMAS[name]
    if dict(frame.schema) != expected:
        got = {c: str(t) for c, t in frame.schema.items()}
        want = {c: str(t) for c, t in expected.items()}
        raise IntegrityError(path, f"schema {got} differs from the expected {want}", repair)
    if frame.height != sidecar["files"][name].get("rows"):
        raise IntegrityError(path, "row count does not match tables.json", repair)
    return frame


def load_occurrence(root: str | Path, sae_id: str) -> tuple[sp.csr_matrix, np.ndarray]:
    """The verified occurrence matrix `[blocks x d_sae]` (CSR) and the global block index of each row."""
    path = AtlasLayout(root).sae_dir(sae_id) / OCCURRENCE_FILE
    try:
        with _snapshot(root, sae_id) as sidecar:
            _verified_path(root, sae_id, OCCURRENCE_FILE, sidecar)
            matrix = sp.load_npz(path)
            with np.load(path) as raw:
                block_index = raw["block_index"]
    except (ValueError, KeyError, OSError) as exc:
        raise IntegrityError(path, f"not a readable occurrence matrix ({exc})", summarize_repair(root, sae_id)) from exc
    return matrix.tocsr(), block_index


class FeatureTables:
    """Both summary tables of one SAE, verified and held in memory, with O(1) latent lookups."""

    def __init__(self, root: str | Path, sae_id: str) -> None:
        self.root, self.sae_id = Path(root), sae_id
        with _snapshot(root, sae_id) as sidecar:
            self.sidecar = sidecar
            self.features = read_table(root, sae_id, FEATURES_FILE, sidecar)
            self.examples = read_table(root, sae_id, EXAMPLES_FILE, sidecar)
        latents = self.examples["latent"].to_numpy()
        is_top = (self.examples["kind"] == "top").to_numpy()
        self._offsets = np.searchsorted(latents, np.arange(self.n_latents + 1), side="left")
        self._n_top = np.diff(np.concatenate([[0], np.cumsum(is_top)])[self._offsets])
        ok = len(latents) == 0 or (latents.min() >= 0 and latents.max() < self.n_latents
                                   and not np.any(np.diff(latents) < 0))
        if ok:
            position = np.arange(len(latents)) - self._offsets[latents]
            ok = np.array_equal(is_top, position < self._n_top[latents])
        if not ok:
            raise IntegrityError(AtlasLayout(root).sae_dir(sae_id) / EXAMPLES_FILE,
                                 "rows are not sorted by (latent, top examples first) within 0..d_sae-1 "
                                 "as the schema requires", summarize_repair(root, sae_id))

    @property
    def params(self) -> dict[str, Any]:
        """Parameters the summary was computed with (tokens, top_k, window, bands, seed...)."""
        return self.sidecar["params"]

    @property
    def n_latents(self) -> int:
        return self.features.height

    def _check_latent(self, latent: int) -> int:
        if not isinstance(latent, (int, np.integer)) or not 0 <= latent < self.n_latents:
            raise InvalidInputError(
                f"latent index {latent!r} out of range for SAE {self.sae_id!r}: valid 0..{self.n_latents - 1}"
            )
        return int(latent)

    def feature(self, latent: int) -> dict[str, Any]:
        """The `features.parquet` row of one latent as a dict."""
        return self.features.row(self._check_latent(latent), named=True)

    def examples_for(self, latent: int, kind: str | None = None) -> pl.DataFrame:
        """Example rows of one latent (top-k first, then bands), optionally only `kind`."""
        i = self._check_latent(latent)
        rows = self.examples.slice(int(self._offsets[i]), int(self._offsets[i + 1] - self._offsets[i]))
        if kind is None:
            return rows
        if kind not in ("top", "band"):
            raise InvalidInputError(f"unknown example kind {kind!r}; valid: top, band")
        n_top = int(self._n_top[i])  # each latent's top examples come first (checked on load)
        return rows.head(n_top) if kind == "top" else rows.slice(n_top)

    def latents_centred_on(self, token_id: int, *, kind: str = "top", limit: int = 20) -> pl.DataFrame:
        """Latents whose `kind` examples centre on `token_id`: columns latent, n_examples,
        max_act; most examples first, then highest activation."""
        _check_token(token_id)
        return (
            self.examples.lazy()
            .filter((pl.col("kind") == kind) & (pl.col("token_id") == token_id))
            .group_by("latent")
            .agg(pl.len().alias("n_examples"), pl.col("act").max().alias("max_act"))
            .sort(["n_examples", "max_act", "latent"], descending=[True, True, False])
            .head(limit)
            .collect()
        )

    def latents_promoting(self, token_id: int, *, limit: int = 20) -> pl.DataFrame:
        """Latents with `token_id` among their stored top logit effects: columns latent, logit;
        largest logit first (empty when the summary had no unembedding)."""
        _check_token(token_id)
        return (
            self.features.lazy()
            .select("latent", "top_logit_ids", "top_logit_values")
            .explode(["top_logit_ids", "top_logit_values"])
            .filter(pl.col("top_logit_ids") == token_id)
            .select("latent", pl.col("top_logit_values").alias("logit"))
            .sort(["logit", "latent"], descending=[True, False])
            .head(limit)
            .collect()
        )


def _check_token(token_id: int) -> None:
    if not isinstance(token_id, (int, np.integer)) or token_id < 0:
        raise InvalidInputError(f"token id must be a non-negative integer, got {token_id!r}")
