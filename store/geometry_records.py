"""Geometry results as per-feature records (`store.feature_records`, `geometry.parquet`):
which circle, concept span, hierarchy node or lobe each feature belongs to, and the run
that found it, so that searches can filter on it and feature pages can show it.

Sources, all read through `store.analysis_runs` (checksums verified):
- `circular` discovery runs: every member of a scored cluster (kind `circle`, the cluster
  id as group, `in_circle` true, period unknown);
- `concept_search` runs: the selective features of each SAE (kind `concept`, their place
  in the span as group, `in_circle` and the fitted period when the concept is ordered and
  its span's values lie in cyclic order);
- `hierarchy` runs: the latents matched to each concept of an edge (kind `hierarchy`);
- `lobes` runs: every latent's co-occurrence lobe (kind `lobe`, the lobe id as group).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.store.analysis_runs import list_runs, read_analysis
from sae_atlas.store.feature_records import GEOMETRY_SCHEMA, write_records
from sae_atlas.store.layout import AtlasLayout

Record = dict[str, Any]


def _record(sae_id: str, latent: int, kind: str, run: str, *, group: int | None = None, name: str | None = None,
            in_circle: bool = False, period: float | None = None, score: float | None = None) -> Record:
    return {"sae_id": sae_id, "latent": int(latent), "kind": kind, "run": run, "group": group, "name": name,
            "in_circle": in_circle, "period": period, "score": score}


def _circular(root: Path) -> list[Record]:
    out = []
    for run in list_runs(root, "circular"):
        stored = read_analysis(root, "circular", run)
        if stored.meta.get("type") != "discovery" or stored.table is None:
            continue  # concept runs fit the residual stream, not features
        for row in stored.table.iter_rows(named=True):
            out.extend(_record(stored.meta["sae_id"], f, "circle", run, group=row["cluster_id"],
                               name=f"cluster {row['cluster_id']}", in_circle=True, score=row["score"])
                       for f in row["features"])
    return out


def _concepts(root: Path) -> list[Record]:
    out = []
    for run in list_runs(root, "concept_search"):
        stored = read_analysis(root, "concept_search", run)
        summary, name = stored.meta["summary"], stored.meta["parameters"]["concept"]["name"]
        for row in stored.table.filter(pl.col("selective")).iter_rows(named=True):
            fit = summary["per_sae"][row["sae_id"]]["fit"]
            cyclic = summary["kind"] == "ordered" and bool(fit.get("cyclic_order"))
            out.append(_record(row["sae_id"], row["latent"], "concept", run, group=row["span_order"],
                               name=f"{name}: {row['value']}", in_circle=cyclic,
                               period=fit.get("fitted_period") if cyclic else None, score=row["selectivity"]))
    return out


def _hierarchy(root: Path) -> list[Record]:
    out = []
    for run in list_runs(root, "hierarchy"):
        stored = read_analysis(root, "hierarchy", run)
        sae_id = stored.meta["parameters"].get("sae_id")
        if sae_id is None or stored.table is None:
            continue  # token-level hierarchy runs have no features
        for row in stored.table.iter_rows(named=True):
            for side in ("child", "parent"):
                out.append(_record(sae_id, row[f"{side}_latent"], "hierarchy", run, name=row[side],
                                   score=row[f"{side}_match"]))
    return out


def _lobes(root: Path) -> list[Record]:
    out = []
    for run in list_runs(root, "lobes"):
        stored = read_analysis(root, "lobes", run)
        sae_id = stored.meta["parameters"]["sae_id"]
        out.extend(_record(sae_id, latent, "lobe", run, group=lobe, name=f"lobe {lobe}")
                   for latent, lobe in stored.table.select("latent", "lobe").iter_rows())
    return out


def collect_records(root: str | Path) -> dict[str, pl.DataFrame]:
    """Every SAE's geometry records from the stored analysis runs (unique rows, sorted)."""
    root = Path(root)
    by_sae: dict[str, list[Record]] = defaultdict(list)
    for record in [*_circular(root), *_concepts(root), *_hierarchy(root), *_lobes(root)]:
        by_sae[record["sae_id"]].append(record)
    out = {}
    for sae_id in AtlasLayout(root).sae_ids():
        frame = pl.DataFrame(by_sae.get(sae_id, []), schema=GEOMETRY_SCHEMA)
        out[sae_id] = frame.unique().sort(["latent", "kind", "run", "group"], nulls_last=True)
    return out


def rebuild_geometry_records(root: str | Path) -> dict[str, int]:
    """Rewrite every SAE's `geometry.parquet` from the stored analyses; rows per SAE."""
    counts = {}
    for sae_id, frame in collect_records(root).items():
        write_records(root, sae_id, "geometry", frame)
        counts[sae_id] = frame.height
    return counts
