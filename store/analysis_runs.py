"""Writing and reading analysis results, every file verified on read.

A run of kind `<kind>` named `<run>` is `analyses/<kind>/<run>.parquet` (main table),
optional `<run>.<name>.parquet` (further tables), PNG figures beside them (the names in
`extra["figures"]`, a list or a dict of names) and `<run>.json` with the parameters,
summary, `created_with()` versions, each table's sha256 and row count and each figure's
sha256 (`figure_sha256`). The kind's `runs.json` lists every completed run with the sha256
of its JSON, so a run whose JSON is deleted or changed is reported, not dropped or served.

Files are written atomically in that order (tables, figures, JSON, then `runs.json` under a
lock), so a run is complete once `runs.json` lists it. Readers verify every checksum and
raise IntegrityError naming the file and the command that rebuilds it. A run on disk that
`runs.json` does not list (a write killed before it registered the run, or a `runs.json`
replaced) is *unregistered*: it is reported, never served, and `register_run` (`sae-atlas
register --analysis KIND/RUN`) records it again once its files verify against its JSON.
Folders written before `runs.json` existed are read as before (tables verified) and adopted
into a `runs.json` by the next run written or registered there.
"""

from __future__ import annotations

import fcntl
import glob
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.store.atomic import (
    atomic_path,
    atomic_write_json,
    read_json,
    remove_temporaries,
    sha256_file,
)
from sae_atlas.store.integrity import verify_file
from sae_atlas.store.layout import AtlasLayout, check_id, created_with, is_id

MAIN = "main"
RUNS_FILE = "runs.json"
FORMAT = 2  # runs.json and figure checksums


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


WRITERS = {"compare": "compare A B --run {run}", "circle_transfer": "compare-circle ... --run {run}",
           "emergence": "emergence ... --run {run}", "crosscoder": "train-crosscoder ... --id {run}",
           "graph": "graph ... --store {run}", "concept_search": "search concept ... --save {run}"}
"""The command that writes a run of each kind that `sae-atlas analyze <kind>` does not write."""


def run_repair(kind: str, run: str) -> str:
    """What to do about a damaged run."""
    writer = WRITERS.get(kind, f"analyze {kind} ... --run {{run}}").format(run=run)
    return (f"re-run the {kind} analysis that wrote run {run!r} (`sae-atlas {writer}`), "
            f"or delete analyses/{kind}/{run}.* and its entry in analyses/{kind}/{RUNS_FILE}")


def unregistered_run(root: str | Path, kind: str, run: str) -> IntegrityError:
    """What is wrong with an unregistered run (`unregistered_runs`) and the command that
    registers it again."""
    _, js = run_paths(root, kind, run)
    return IntegrityError(
        js, f"the run is on disk but not recorded in {RUNS_FILE} (a write killed before it registered the run, "
        f"or a {RUNS_FILE} replaced)",
        f"register it again with `sae-atlas register <atlas> --analysis {kind}/{run}` (its files are "
        f"verified against its JSON first), or delete analyses/{kind}/{run}.*",
    )


def figure_names(meta: dict[str, Any]) -> list[str]:
    """The figure file names a run's JSON names (`figures`: a list, or a dict of names)."""
    figures = meta.get("figures") or []
    names = list(figures.values()) if isinstance(figures, dict) else figures
    return [str(n) for n in names] if isinstance(names, list) else []


@contextmanager
def _runs_lock(folder: Path) -> Iterator[None]:
    """An exclusive advisory lock on a kind's `runs.json` (writers only)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f".{RUNS_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
    """Write a run's tables, then its JSON, then its `runs.json` entry; return the JSON
    path. `tables` maps a name to a frame (`"main"` becomes `<run>.parquet`); figures named
    in `extra["figures"]` must already be written beside them (their sha256 is recorded)."""
    files = {}
    for name, frame in (tables or {}).items():
        path, _ = run_paths(root, kind, run, name)
        remove_temporaries(path)  # what a killed write of this run left
        with atomic_path(path) as tmp:
            frame.write_parquet(tmp, compression="zstd")
        files[name] = {"file": path.name, "sha256": sha256_file(path), "rows": frame.height}
    _, js = run_paths(root, kind, run)
    extra = extra or {}
    figures = {}
    for name in figure_names(extra):
        figure = js.parent / check_id(name, "figure name")
        if not figure.is_file():
            raise InvalidInputError(f"figure {name!r} of analysis run {kind}/{run} was not written before the run")
        figures[name] = sha256_file(figure)
    meta = {"kind": kind, "run": run, "parameters": parameters, "summary": summary or {},
            "tables": files, "created_with": created_with(), **extra, "figure_sha256": figures, "format": FORMAT}
    remove_temporaries(js)
    atomic_write_json(js, meta)
    _record_run(js, kind)
    return js


def _record_run(js: Path, kind: str) -> None:
    """Add the run whose JSON is `js` to its kind's `runs.json` (under the lock); a folder
    without one (new, or from before it existed) adopts its runs as they are."""
    with _runs_lock(js.parent):
        runs = _read_runs(js.parent, kind, writing=True)
        if runs is None:
            runs = {p.stem: {"json": p.name, "sha256": sha256_file(p)} for p in _json_files(js.parent)}
        runs[js.stem] = {"json": js.name, "sha256": sha256_file(js)}
        remove_temporaries(js.parent / RUNS_FILE)
        atomic_write_json(js.parent / RUNS_FILE, {"format": FORMAT, "runs": dict(sorted(runs.items()))})


def register_run(root: str | Path, kind: str, run: str) -> dict[str, Any]:
    """Record an unregistered run (its JSON on disk, not in `runs.json`) in its kind's
    `runs.json` after checking every file its JSON records (`verify_run_files`); the run's
    JSON. NotFoundError when the run has no JSON, InvalidInputError when it is registered."""
    _, js = run_paths(root, kind, run)
    if not js.is_file():
        if any(js.parent.glob(f"{glob.escape(run)}.*")):  # its tables or figures are left
            raise IntegrityError(js, "file is missing beside the run's other files, so they cannot be verified",
                                 run_repair(kind, run))
        raise NotFoundError(f"no {kind} analysis run {run!r} on disk (no analyses/{kind}/{js.name})")
    if run in (_read_runs(js.parent, kind, writing=True) or {}):
        raise InvalidInputError(f"analysis run {kind}/{run} is already registered in analyses/{kind}/{RUNS_FILE}")
    meta = verify_run_files(root, kind, run)
    _record_run(js, kind)
    return meta


def _json_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.json") if p.name != RUNS_FILE) if folder.is_dir() else []


def _read_runs(folder: Path, kind: str, *, writing: bool = False) -> dict[str, dict[str, str]] | None:
    """The kind's `runs.json` entries (run -> json file, sha256), or None for a folder written
    before it existed; IntegrityError when it is unreadable or (for readers) missing from a
    folder whose runs were written with it."""
    path = folder / RUNS_FILE
    repair = (f"re-run the {kind} analyses (each run re-registers itself); or delete analyses/{kind}/{RUNS_FILE} "
              f"and register the runs on disk again (`sae-atlas register <atlas> --analysis {kind}/RUN`, "
              f"which verifies each); or delete analyses/{kind}/ to start the kind afresh")
    if not path.exists():
        if writing:
            return None
        for js in _json_files(folder):
            try:
                declared = read_json(js, repair).get("format")
            except (IntegrityError, AttributeError):
                continue
            if declared == FORMAT:
                raise IntegrityError(path, f"file is missing but run {js.stem!r} was recorded in it", repair)
        return None
    data = read_json(path, repair)
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("json"), str) and isinstance(e.get("sha256"), str)
            for e in runs.values()):
        raise IntegrityError(path, "not a runs index ({'runs': {run: {json, sha256}}})", repair)
    return runs


def list_runs(root: str | Path, kind: str) -> list[str]:
    """The runs of one kind, sorted: those its `runs.json` lists (every `<run>.json` in a folder
    from before it existed). IntegrityError when `runs.json` is damaged."""
    folder = AtlasLayout(root).analysis_dir(kind)
    runs = _read_runs(folder, kind)
    return sorted(runs) if runs is not None else [p.stem for p in _json_files(folder)]


def unregistered_runs(root: str | Path, kind: str) -> list[str]:
    """Runs with a `<run>.json` that `runs.json` does not list (a write killed before it
    registered the run, or a `runs.json` replaced); empty for a folder from before `runs.json`."""
    folder = AtlasLayout(root).analysis_dir(kind)
    runs = _read_runs(folder, kind)
    return [] if runs is None else [p.stem for p in _json_files(folder) if p.stem not in runs]


def analysis_kinds(root: str | Path) -> list[str]:
    """The kinds with a folder under `analyses/`, sorted (a folder whose name no kind can
    have, such as `.ipynb_checkpoints`, is none)."""
    base = AtlasLayout(root).root / "analyses"
    return sorted(p.name for p in base.iterdir() if p.is_dir() and is_id(p.name)) if base.is_dir() else []


def verify_run(root: str | Path, kind: str, run: str, repair: str | None = None) -> dict[str, Any]:
    """The run's JSON after checking the sha256 of every file of the run (JSON, tables,
    figures) against what `runs.json` and the JSON record; NotFoundError lists the runs
    that exist, IntegrityError names the damaged file."""
    _, js = run_paths(root, kind, run)
    repair = repair or run_repair(kind, run)
    runs = _read_runs(js.parent, kind)
    if runs is not None and run not in runs:
        if js.exists():
            verify_run_files(root, kind, run, repair)  # a damaged file is named first
            raise unregistered_run(root, kind, run)
        raise NotFoundError(f"no {kind} analysis run {run!r}; runs: {', '.join(sorted(runs)) or '(none)'}")
    if runs is None and not js.exists():
        raise NotFoundError(f"no {kind} analysis run {run!r}; runs: {', '.join(list_runs(root, kind)) or '(none)'}")
    if runs is not None:
        try:
            verify_file(js, runs[run]["sha256"], f"analyses/{kind}/{RUNS_FILE}", repair)
        except IntegrityError:
            fresh = _read_runs(js.parent, kind) or {}  # the run may have been rewritten meanwhile
            verify_file(js, fresh.get(run, {}).get("sha256", ""), f"analyses/{kind}/{RUNS_FILE}", repair)
    return verify_run_files(root, kind, run, repair)


def verify_run_files(root: str | Path, kind: str, run: str, repair: str | None = None) -> dict[str, Any]:
    """The run's JSON after checking the sha256 of every table and figure it records, without
    consulting `runs.json` (IntegrityError naming the damaged file)."""
    _, js = run_paths(root, kind, run)
    repair = repair or run_repair(kind, run)
    meta = read_json(js, repair)
    if not isinstance(meta, dict):
        raise IntegrityError(js, "not a JSON object", repair)
    recorded = f"{js.name} (the run's JSON)"
    for info in (meta.get("tables") or {}).values():
        verify_file(js.parent / info["file"], info["sha256"], recorded, repair)
    for name, sha in (meta.get("figure_sha256") or {}).items():
        verify_file(js.parent / name, sha, recorded, repair)
    return meta


def read_analysis(root: str | Path, kind: str, run: str, repair: str | None = None) -> AnalysisRun:
    """Read a run after verifying every file of it (`verify_run`)."""
    repair = repair or run_repair(kind, run)
    meta = verify_run(root, kind, run, repair)
    _, js = run_paths(root, kind, run)
    tables = {}
    for name, info in meta.get("tables", {}).items():
        path = js.parent / info["file"]
        try:
            tables[name] = pl.read_parquet(path)
        except Exception as exc:  # polars raises several error types for unreadable parquet
            raise IntegrityError(path, f"not a readable parquet file ({exc})", repair) from exc
    return AnalysisRun(kind, run, tables, meta)


def figure_owner(root: str | Path, kind: str, name: str) -> tuple[str, dict[str, Any]] | None:
    """`(run, verified meta)` of the run whose JSON records figure `name`, or None. The
    IntegrityError of that run when it is damaged or unregistered."""
    for run in list_runs(root, kind) + unregistered_runs(root, kind):
        try:
            meta = verify_run(root, kind, run)
        except IntegrityError:
            _, js = run_paths(root, kind, run)
            if js.exists() and name in figure_names(read_json(js, run_repair(kind, run)) or {}):
                raise
            continue
        if name in figure_names(meta):
            return run, meta
    return None
