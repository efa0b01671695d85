"""The one place where the Atlas facade touches the packages below it.

Every other module of `api` (the facade, HTTP, CLI) goes through these functions, so a
change in `store`, `saes` or `geometry` is absorbed here. Resources are loaded once per
process and kept (feature tables, SAE weights, search indexes, the model); loading is
guarded by a lock so concurrent HTTP requests share one copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import torch

from geometry import results
from saes.models import ModelHandle
from store.atomic import read_json
from store.errors import IntegrityError, NotFoundError
from store.layout import AtlasLayout, check_id
from store.tables import FeatureTables, histogram_edges

T = TypeVar("T")


class ResourceCache:
    """Loads each keyed resource once (thread-safe) and returns the same object afterwards."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, ...], Any] = {}
        self._lock = threading.RLock()  # loaders may load other resources

    def get(self, key: tuple[str, ...], load: Callable[[], T]) -> T:
        """The resource under `key`, calling `load()` the first time."""
        if key in self._items:
            return self._items[key]
        with self._lock:
            if key not in self._items:
                self._items[key] = load()
            return self._items[key]


# feature tables -----------------------------------------------------------------------
def feature_tables(root: Path, sae_id: str) -> FeatureTables:
    """The verified summary tables of one SAE (NotFoundError if not summarized,
    IntegrityError if damaged)."""
    return FeatureTables(root, sae_id)


def histogram(tables: FeatureTables, row: dict[str, Any]) -> dict[str, list[float]]:
    """A latent's activation histogram: bin `edges` (len n+2, first 0) and `counts` (n+1)."""
    counts = list(row["hist_counts"])
    bpo = int(tables.params.get("bins_per_octave", 8))
    edges = histogram_edges(float(row["hist_top"]), len(counts) - 1, bpo)
    return {"edges": [0.0, *edges.tolist()], "counts": counts}


# SAE weights and the model ------------------------------------------------------------
def load_sae(root: Path, sae_id: str) -> Any:
    """The SAE of `sae_id` (eval mode, CPU), read from its SAELens folder."""
    from saes.atlas_saes import load_atlas_sae

    return load_atlas_sae(root, sae_id)


def verify_weights(root: Path, sae_id: str) -> None:
    """Check the SAE's weights against the sha256 its cfg.json records (IntegrityError naming
    the file and the repair if they differ or are missing; hashed once per process)."""
    from store.integrity import verify_sae_weights

    verify_sae_weights(root, sae_id)


def sae_config(root: Path, sae_id: str) -> dict[str, Any]:
    """The SAE's cfg.json (SAELens layout) as a dict."""
    folder = AtlasLayout(root).require_sae(sae_id)
    return read_json(folder / "cfg.json", f"re-train or re-import SAE {sae_id!r}")


def sae_architecture(cfg: dict[str, Any]) -> str | None:
    """The true architecture of an SAE from its cfg.json (not SAELens' export name)."""
    from saes.formats.saelens import true_architecture

    return true_architecture(cfg)


def sae_hook(root: Path, sae_id: str) -> str:
    """The hook an SAE reads."""
    from saes.atlas_saes import atlas_sae_hook

    return atlas_sae_hook(root, sae_id)


def load_model(spec: Any) -> Any:
    """The atlas's model (`saes.models.load_model`; loaded once per process)."""
    from saes.models import load_model as load

    return load(spec)


def run_hooks(handle: ModelHandle, tokens: torch.Tensor, hooks: list[str]) -> dict[str, torch.Tensor]:
    """Activations `[1, T, d]` of `hooks` for `tokens`."""
    from saes.cache import run_hooks as run

    return run(handle, tokens, hooks)


# maps and analyses -----------------------------------------------------------------------
def read_map(root: Path, sae_id: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The SAE's verified map table (`geometry.maps`: latent, x, y, knn_overlap, the
    co-occurrence basis' columns, label columns such as cluster) and its sidecar, or
    NotFoundError when none was built."""
    from geometry.maps import MAP_FILE, MAP_META
    from geometry.maps import read_map as read

    folder = AtlasLayout(root).require_sae(sae_id)
    if not (folder / MAP_FILE).exists() and not (folder / MAP_META).exists():  # one without the other is damage
        raise NotFoundError(f"SAE {sae_id!r} has no map yet; build it with `sae-atlas analyze map`")
    return read(root, sae_id)


def analysis_runs(root: Path) -> list[dict[str, Any]]:
    """Every stored analysis run: kind, run, its table and figure file names, and `status`
    ("ok", or "damaged" with the `problem`: the file, what is wrong and the repair). Every
    file of every run is verified (`geometry.results.verify_run`, hashes cached per file
    version), so a deleted or changed file shows here instead of a run going missing."""
    base = AtlasLayout(root).root / "analyses"
    if not base.is_dir():
        return []
    rows = []
    for kind_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        kind = kind_dir.name
        try:
            runs = results.list_runs(root, kind) + results.unrecorded_runs(root, kind)
        except IntegrityError as exc:  # the kind's runs.json itself is damaged
            rows += [_run_row(kind_dir, p.stem, None, exc) for p in sorted(kind_dir.glob("*.json"))
                     if p.name != results.RUNS_FILE]
            continue
        for run in sorted(runs):
            try:
                rows.append(_run_row(kind_dir, run, results.verify_run(root, kind, run), None))
            except IntegrityError as exc:
                rows.append(_run_row(kind_dir, run, None, exc))
    return rows


def _run_row(kind_dir: Path, run: str, meta: dict[str, Any] | None, problem: IntegrityError | None) -> dict[str, Any]:
    """A listing row; the files come from the verified JSON, or by name for a damaged run or
    one written before figures were recorded."""
    main = ((meta or {}).get("tables") or {}).get(results.MAIN)
    figures = results.figure_names(meta or {})
    if meta is None or "figure_sha256" not in meta:
        figures = sorted(p.name for p in kind_dir.glob("*.png") if p.name == f"{run}.png"
                         or p.name.startswith(f"{run}."))
    table = main["file"] if main else f"{run}.parquet" if (kind_dir / f"{run}.parquet").exists() else None
    return {"kind": kind_dir.name, "run": run, "table": table, "figures": figures,
            "status": "ok" if problem is None else "damaged",
            "problem": None if problem is None else _atlas_relative(problem, kind_dir.parent.parent)}


def _atlas_relative(problem: IntegrityError, root: Path) -> str:
    """The error's message with its file relative to the atlas (listings do not reveal where it lives)."""
    path = Path(problem.path)
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    return f"{shown}: {problem.problem}. To repair: {problem.repair}"


def analysis_run(root: Path, kind: str, run: str) -> tuple[dict[str, Any], dict[str, Any], pl.DataFrame | None]:
    """`(files, meta, table)` of one run, every file verified (`geometry.results.read_analysis`);
    NotFoundError names the runs of that kind and the kinds."""
    kind_dir = AtlasLayout(root).analysis_dir(kind)
    try:
        stored = results.read_analysis(root, kind, check_id(run, "run name"))
    except NotFoundError as exc:
        kinds = sorted({r["kind"] for r in analysis_runs(root)})
        raise NotFoundError(f"{exc}; kinds: {', '.join(kinds) or '(none)'}") from exc
    return _run_row(kind_dir, run, stored.meta, None), stored.meta, stored.table


def figure_path(root: Path, kind: str, name: str) -> Path:
    """The path of a PNG under `analyses/<kind>/` after checking it against the sha256 its
    run recorded (NotFoundError if no run has it; IntegrityError if it is damaged). Runs
    written before figures were recorded serve theirs unverified."""
    kind_dir = AtlasLayout(root).analysis_dir(kind)
    path = kind_dir / check_id(name, "figure name")
    if name.endswith(".png"):
        owner = results.figure_owner(root, kind, name)  # verifies the owner's files, this one included
        if owner is not None and name in owner[1].get("figure_sha256", {}):
            return path
        if path.is_file() and any(name == f"{run}.png" or name.startswith(f"{run}.")
                                  for run in _runs_without_figure_checksums(root, kind)):
            return path
    raise NotFoundError(f"no figure {name!r} under analyses/{kind}")


def _runs_without_figure_checksums(root: Path, kind: str) -> list[str]:
    return [run for run in results.list_runs(root, kind)
            if "figure_sha256" not in results.verify_run(root, kind, run)]


def run_circular_discovery(root: Path, sae_id: str, max_tokens: int) -> dict[str, Any]:
    """Run circular-feature discovery on one SAE (`api.analyses.circular`); the new run's files."""
    from api.analyses.circular import discover_for_sae

    _, meta_path = discover_for_sae(root, sae_id, max_tokens=max_tokens)
    return {"kind": meta_path.parent.name, "run": meta_path.stem}

