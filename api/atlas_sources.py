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


def run_hooks(handle: Any, tokens: torch.Tensor, hooks: list[str]) -> dict[str, torch.Tensor]:
    """Activations `[1, T, d]` of `hooks` for `tokens`."""
    from saes.cache import run_hooks as run

    return run(handle, tokens, hooks)


# maps and analyses -----------------------------------------------------------------------
def read_map(root: Path, sae_id: str) -> pl.DataFrame:
    """The SAE's verified map table (`geometry.maps`: latent, x, y, knn_overlap, label
    columns such as cluster), or NotFoundError when none was built."""
    from geometry.maps import MAP_FILE, MAP_META
    from geometry.maps import read_map as read

    folder = AtlasLayout(root).require_sae(sae_id)
    if not (folder / MAP_FILE).exists() and not (folder / MAP_META).exists():  # one without the other is damage
        raise NotFoundError(f"SAE {sae_id!r} has no map yet; build it with `sae-atlas analyze map`")
    return read(root, sae_id)[0]


def analysis_runs(root: Path) -> list[dict[str, Any]]:
    """Every stored analysis run: kind, run, and its table / figure file names."""
    base = AtlasLayout(root).root / "analyses"
    if not base.is_dir():
        return []
    runs = []
    for kind_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        for meta in sorted(kind_dir.glob("*.json")):
            runs.append(_run_files(kind_dir, meta.stem))
    return runs


def _run_files(kind_dir: Path, run: str) -> dict[str, Any]:
    table = kind_dir / f"{run}.parquet"
    figures = sorted(p.name for p in kind_dir.glob("*.png") if p.name == f"{run}.png"
                     or p.name.startswith(f"{run}."))
    return {"kind": kind_dir.name, "run": run, "table": table.name if table.exists() else None,
            "figures": figures}


def analysis_run(root: Path, kind: str, run: str) -> tuple[dict[str, Any], dict[str, Any], pl.DataFrame | None]:
    """`(files, meta, table)` of one run; NotFoundError names the runs of that kind."""
    kind_dir = AtlasLayout(root).analysis_dir(kind)
    check_id(run, "run name")
    meta_path = kind_dir / f"{run}.json"
    if not meta_path.exists():
        runs = sorted(p.stem for p in kind_dir.glob("*.json")) if kind_dir.is_dir() else []
        kinds = sorted({r["kind"] for r in analysis_runs(root)})
        raise NotFoundError(
            f"no {kind!r} analysis run {run!r}; runs of that kind: {', '.join(runs) or '(none)'}; "
            f"kinds: {', '.join(kinds) or '(none)'}"
        )
    repair = f"re-run the {kind} analysis that wrote {run!r}"
    meta = read_json(meta_path, repair)
    files = _run_files(kind_dir, run)
    table = None
    if files["table"]:
        try:
            table = pl.read_parquet(kind_dir / files["table"])
        except Exception as exc:  # polars raises several error types for unreadable parquet
            raise IntegrityError(kind_dir / files["table"], f"not a readable parquet file ({exc})", repair) from exc
    return files, meta, table


def figure_path(root: Path, kind: str, name: str) -> Path:
    """The path of a PNG under `analyses/<kind>/` (NotFoundError if absent; no traversal)."""
    kind_dir = AtlasLayout(root).analysis_dir(kind)
    check_id(name, "figure name")
    path = kind_dir / name
    if not name.endswith(".png") or not path.is_file():
        raise NotFoundError(f"no figure {name!r} under analyses/{kind}")
    return path


def run_circular_discovery(root: Path, sae_id: str, max_tokens: int) -> dict[str, Any]:
    """Run circular-feature discovery on one SAE (`api.analyses.circular`); the new run's files."""
    from api.analyses.circular import discover_for_sae

    _, meta_path = discover_for_sae(root, sae_id, max_tokens=max_tokens)
    return _run_files(meta_path.parent, meta_path.stem)

