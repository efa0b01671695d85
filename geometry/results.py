"""Writing and reading analysis results: `analyses/<kind>/<run>.parquet` (main table),
optional `analyses/<kind>/<run>.<name>.parquet` (further tables) and
`analyses/<kind>/<run>.json` with the parameters, summary, `created_with()` versions and
each table's sha256 and row count.

Every file is written atomically and the JSON last, so its presence marks a complete run;
readers verify the checksums and raise IntegrityError naming the file and the command
that rebuilds it. Any analysis kind can use this (hierarchy, probe, crystals, lobes,
galaxy, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from store.errors import IntegrityError, NotFoundError
from store.layout import AtlasLayout, check_id, created_with

MAIN = "main"


@dataclass
class AnalysisRun:
    """A stored run: its tables by name (`"main"` first) and its JSON metadata."""

    kind: str
    run: str
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def table(self) -> pl.DataFrame | None:
        return self.tables.get(MAIN)


def run_paths(root: str | Path, kind: str, run: str, table: str = MAIN) -> tuple[Path, Path]:
    """`(parquet, json)` paths of one table of a run."""
    base = AtlasLayout(root).analysis_dir(kind)
    check_id(run, "run name")
    name = f"{run}.parquet" if table == MAIN else f"{run}.{check_id(table, 'table name')}.parquet"
    return base / name, base / f"{run}.json"


def write_analysis(
    root: str | Path,
    kind: str,
    run: str,
    *,
    parameters: dict[str, Any],
    summary: dict[str, Any] | None = None,
    tables: dict[str, pl.DataFrame] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a run's tables then its JSON atomically; return the JSON path. `tables` maps
    a name to a frame (`"main"` becomes `<run>.parquet`)."""
    files = {}
    for name, frame in (tables or {}).items():
        path, _ = run_paths(root, kind, run, name)
        with atomic_path(path) as tmp:
            frame.write_parquet(tmp, compression="zstd")
        files[name] = {"file": path.name, "sha256": sha256_file(path), "rows": frame.height}
    _, js = run_paths(root, kind, run)
    meta = {"kind": kind, "run": run, "parameters": parameters, "summary": summary or {},
            "tables": files, "created_with": created_with(), **(extra or {})}
    atomic_write_json(js, meta)
    return js


def list_runs(root: str | Path, kind: str) -> list[str]:
    """Completed runs of one kind, sorted."""
    base = AtlasLayout(root).analysis_dir(kind)
    return sorted(p.stem for p in base.glob("*.json")) if base.is_dir() else []


def read_analysis(root: str | Path, kind: str, run: str, repair: str | None = None) -> AnalysisRun:
    """Read a run, verifying every table's checksum; NotFoundError lists the runs that exist."""
    _, js = run_paths(root, kind, run)
    if not js.exists():
        raise NotFoundError(f"no {kind} analysis run {run!r}; runs: {', '.join(list_runs(root, kind)) or '(none)'}")
    repair = repair or f"re-run `sae-atlas analyze {kind} --atlas {root} --run {run}`"
    meta = read_json(js, repair)
    tables = {}
    for name, info in meta.get("tables", {}).items():
        path = js.parent / info["file"]
        if not path.exists():
            raise IntegrityError(path, "file is missing", repair)
        if sha256_file(path) != info["sha256"]:
            raise IntegrityError(path, "sha256 does not match the run's JSON (corrupt or truncated)", repair)
        tables[name] = pl.read_parquet(path)
    return AnalysisRun(kind, run, tables, meta)
