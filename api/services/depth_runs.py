"""Stored depth runs (`analyses/depth/<run>`, written by `sae-atlas analyze depth`) as the
Depth page and the feature page read them: the listing with each run's status, one run
(profile, CKA matrix, trajectory distributions, extreme tokens, joined features; families;
a model pair's cross-CKA and shift),
and where one SAE feature fires in depth terms."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.depth import (
    CkaMatrix,
    DepthKind,
    DepthRun,
    DepthRunRow,
    DepthShape,
    Distribution,
    ExtremeToken,
    FamilyDepth,
    FeatureDepth,
)
from sae_atlas.api.services.analyses import run_states
from sae_atlas.store import analysis_runs
from sae_atlas.store.atomic import file_version
from sae_atlas.store.hooks import hook_layer
from sae_atlas.store.layout import check_id

KIND = "depth"
Z_SHIFT = 2.0
"""|z| from which a feature's tokens differ from its layer's (`FeatureDepth.shape`)."""
FEATURES_SHOWN = 8
"""Features per SAE and direction (lowest / highest local-dimension z) in `DepthRun.features`."""
DISTRIBUTED = ("convergence_index", "mean_curvature", "path_length")
EXTREMES = {"lowest_convergence": "convergence_index", "highest_curvature": "mean_curvature"}


def _kind(meta: dict[str, Any]) -> DepthKind:
    if "model_b" in meta.get("parameters", {}):
        return "pair"
    return "families" if "tests" in meta.get("tables", {}) else "corpus"


def depth_runs(root: Any) -> list[DepthRunRow]:
    """Every stored depth run with its headline and status (a damaged or unregistered run
    names its problem and carries no headline)."""
    rows = []
    for state in run_states(root, KIND):
        meta = state.meta or {}
        params, summary = meta.get("parameters", {}), meta.get("summary", {})
        rows.append(DepthRunRow(
            run=state.run, kind=_kind(meta), model=params.get("model"), model_b=params.get("model_b"),
            layers=list(params.get("layers", [])), n_tokens=summary.get("n_tokens"),
            id_peak_layer=summary.get("id_peak_layer"),
            families=list(summary["families"]) if "families" in summary else None,
            sae_ids=list(params.get("sae_ids", [])), status=state.status,
            problem=None if state.problem is None else state.problem.describe(root)))
    return rows


def depth_run(ctx: AtlasContext, run: str) -> DepthRun:
    """One stored depth run, every file verified (NotFoundError lists the runs; a damaged or
    unregistered one raises IntegrityError naming the file or the command); built once per
    version of the run's JSON."""
    meta = analysis_runs.verify_run(ctx.root, KIND, check_id(run, "run name"))
    _, js = analysis_runs.run_paths(ctx.root, KIND, run)
    return ctx.cache.current(("depth-run", run), file_version(js), lambda: _build(ctx, run, meta))


def _build(ctx: AtlasContext, run: str, meta: dict[str, Any]) -> DepthRun:
    stored = analysis_runs.read_analysis(ctx.root, KIND, run)
    params, summary = meta.get("parameters", {}), meta.get("summary", {})
    folder = analysis_runs.run_paths(ctx.root, KIND, run)[1].parent
    figures = [folder / name for name in analysis_runs.figure_names(meta)]
    layers = [int(layer) for layer in params.get("layers", [])]
    kind = _kind(meta)
    if kind == "pair":
        shift = stored.tables.get("shift")
        return DepthRun(run=run, kind="pair", parameters=params, summary=summary, layers=layers,
                        cka=_cka_matrix(stored.tables["main"], layers, [int(b) for b in params.get("layers_b", [])]),
                        shift=[] if shift is None else shift.to_dicts(), figures=figures)
    if kind == "families":
        families = stored.tables["main"]
        return DepthRun(run=run, kind="families", parameters=params, summary=summary, layers=layers,
                        families=[_family(row, layers) for row in families.iter_rows(named=True)],
                        family_tests=stored.tables["tests"].sort("p_value").to_dicts(), figures=figures)
    main = stored.tables["main"]
    tokens = stored.tables.get("tokens")
    joined = stored.tables.get("features")
    return DepthRun(
        run=run, kind="corpus", parameters=params, summary=summary, layers=main["layer"].to_list(),
        profile=main.to_dicts(), cka=_cka_matrix(stored.tables["cka"], *[main["layer"].to_list()] * 2),
        distributions={} if tokens is None else {name: _distribution(tokens[name]) for name in DISTRIBUTED
                                                 if name in tokens.columns},
        extreme_tokens=_extreme_tokens(summary),
        features=[] if joined is None else _feature_extremes(ctx, run, joined, main),
        figures=figures)


def _family(row: dict[str, Any], layers: list[int]) -> FamilyDepth:
    return FamilyDepth(family=row["family"], n_prompts=row["n_prompts"], convergence_index=row["convergence_index"],
                       curvature=row["curvature"], path_length=row["path_length"],
                       lid=[row.get(f"lid_{layer}") for layer in layers])


def _cka_matrix(cka: pl.DataFrame, layers: list[int], layers_b: list[int]) -> CkaMatrix:
    """The long table (layer_a, layer_b, cka) as a matrix: rows `layers`, columns `layers_b`."""
    wide = cka.pivot(on="layer_b", index="layer_a", values="cka")
    rows = pl.DataFrame({"layer_a": layers}, schema={"layer_a": wide["layer_a"].dtype}).join(
        wide, on="layer_a", how="left", maintain_order="left")
    return CkaMatrix(layers=layers, layers_b=layers_b, values=rows.select([str(b) for b in layers_b]).to_numpy().tolist())


def _distribution(values: pl.Series, bins: int = 30) -> Distribution:
    v = values.cast(pl.Float64).fill_nan(None).drop_nulls().to_numpy()
    if not len(v):
        return Distribution(edges=[], counts=[], mean=None, median=None)
    counts, edges = np.histogram(v, bins=bins)
    return Distribution(edges=edges.tolist(), counts=counts.tolist(), mean=float(v.mean()),
                        median=float(np.median(v)))


def _extreme_tokens(summary: dict[str, Any]) -> list[ExtremeToken]:
    rows = []
    for group, metric in EXTREMES.items():
        for r in summary.get("extreme_tokens", {}).get(group, []):
            rows.append(ExtremeToken(metric=metric, value=r.get(metric), block=r["block"], position=r["position"],
                                     token=r["token"], text=r.get("text"), context=r.get("context")))
    return rows


def _sae_layer(ctx: AtlasContext, frame: pl.DataFrame, sae_id: str) -> int:
    """The layer the run read `sae_id` at: its table's `layer` column, else the SAE's
    recorded hook (-1 when neither names one)."""
    if "layer" in frame.columns and frame.height:
        return int(frame["layer"][0])
    return hook_layer(ctx.recorded(sae_id).get("hook", ""))


def _feature_extremes(ctx: AtlasContext, run: str, joined: pl.DataFrame, main: pl.DataFrame) -> list[FeatureDepth]:
    """Per SAE, the `FEATURES_SHOWN` features with the lowest and with the highest local-dimension z."""
    out: list[FeatureDepth] = []
    for (sae_id,), frame in joined.filter(pl.col("lid_z").is_finite()).group_by("sae_id", maintain_order=True):
        layer = _sae_layer(ctx, frame, sae_id)
        ranked = frame.sort("lid_z")
        picked = pl.concat([ranked.head(FEATURES_SHOWN), ranked.tail(FEATURES_SHOWN).reverse()]).unique(
            "feature", maintain_order=True)
        out.extend(feature_depth_row(run, sae_id, layer, row, main) for row in picked.iter_rows(named=True))
    return out


def _shape(z: float | None) -> DepthShape:
    if z is not None and np.isfinite(z) and z <= -Z_SHIFT:
        return "compressing"
    if z is not None and np.isfinite(z) and z >= Z_SHIFT:
        return "expanding"
    return "typical"


def _num(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"


def feature_depth_row(run: str, sae_id: str, layer: int, row: dict[str, Any], main: pl.DataFrame) -> FeatureDepth:
    """One row of a run's `features` table as a `FeatureDepth`, with the layer's local
    dimension quantiles (from the run's main table) and the finding in a sentence."""
    at = main.filter(pl.col("layer") == layer)
    q10, q90 = (at[c][0] if at.height else None for c in ("lid_q10", "lid_q90"))
    lid_all = row["lid_mean"] - row["lid_shift"]
    shape = _shape(row["lid_z"])
    where = {"compressing": "fires where the representation is compressing",
             "expanding": "fires where the representation is expanding",
             "typical": "fires where the local dimension is typical"}[shape]
    says = (f"{where}: at layer {layer} its {row['n_fires']} tokens have local dimension {_num(row['lid_mean'])} "
            f"against {_num(lid_all)} over all tokens (z = {_num(row['lid_z'])}; the layer's 10-90% range "
            f"{_num(q10)}-{_num(q90)})")
    turns = []
    cz, kz = row.get("convergence_index_z"), row.get("curvature_z")
    if cz is not None and np.isfinite(cz) and abs(cz) >= Z_SHIFT:
        turns.append(f"they point their final way {'earlier' if cz > 0 else 'later'} than most tokens "
                     f"(convergence z = {_num(cz)})")
    if kz is not None and np.isfinite(kz) and abs(kz) >= Z_SHIFT:
        turns.append(f"their paths turn {'more' if kz > 0 else 'less'} than most (curvature z = {_num(kz)})")
    return FeatureDepth(
        run=run, sae_id=sae_id, feature=int(row["feature"]), layer=layer, n_fires=int(row["n_fires"]),
        lid_mean=row["lid_mean"], lid_all=lid_all, lid_z=row["lid_z"], lid_layer_q10=q10, lid_layer_q90=q90,
        convergence_index_mean=row.get("convergence_index_mean"), convergence_index_z=cz,
        curvature_mean=row.get("curvature_mean"), curvature_z=kz, shape=shape,
        says=says + ("; " + " and ".join(turns) if turns else "") + ".")


def feature_depth(ctx: AtlasContext, sae_id: str, latent: int, layer: int) -> list[FeatureDepth]:
    """Where feature `latent` of `sae_id` fires in depth terms, from every intact depth run
    that joined that SAE (`analyze depth --sae`); empty when none did or the feature fired on
    too few of a run's tokens. Damaged or unregistered runs are left out (the listing names them)."""
    out = []
    for state in run_states(ctx.root, KIND):
        meta = state.meta or {}
        if state.status != "ok" or sae_id not in meta.get("parameters", {}).get("sae_ids", []) \
                or "features" not in meta.get("tables", {}):
            continue
        joined, main = _joined_tables(ctx, state.run, meta)
        hit = joined.filter((pl.col("sae_id") == sae_id) & (pl.col("feature") == latent))
        if hit.height:
            out.append(feature_depth_row(state.run, sae_id, layer, hit.row(0, named=True), main))
    return out


def _joined_tables(ctx: AtlasContext, run: str, meta: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The run's `features` and `main` tables (verified with the run), read once per version."""
    tables = meta["tables"]
    version = (tables["features"]["sha256"], tables["main"]["sha256"])
    folder = analysis_runs.run_paths(ctx.root, KIND, run)[1].parent
    return ctx.cache.current(("depth-features", run), version, lambda: (
        pl.read_parquet(folder / tables["features"]["file"]), pl.read_parquet(folder / tables["main"]["file"])))
