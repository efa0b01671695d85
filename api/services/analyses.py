"""The service layer of `analyses`; its other layers: `sae_atlas.api.http.routers.analyses` (HTTP),
`sae_atlas.api.operations.analyses` (parameter).

Stored geometry results (`analyses/<kind>/<run>.*`): the listing with each run's
status (ok, damaged or unregistered), one run with its table and figures, figure files
checked against their run, and circular-feature discovery on one SAE."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from sae_atlas.api.analyses.circular import discover_for_sae
from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.analyses import CircularParams
from sae_atlas.api.results.analysis import (
    KIND_TYPES,
    AnalysisResult,
    AnalysisRunFiles,
    CircularDiscovery,
)
from sae_atlas.api.results.sae import Status
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services.labels import with_labels
from sae_atlas.errors import IntegrityError, NotFoundError
from sae_atlas.geometry.circular_discovery import DiscoveryParams
from sae_atlas.store.analysis_runs import (
    MAIN,
    RUNS_FILE,
    analysis_kinds,
    figure_names,
    figure_owner,
    list_runs,
    read_analysis,
    unregistered_run,
    unregistered_runs,
    verify_run,
    verify_run_files,
)
from sae_atlas.store.layout import AtlasLayout, check_id


@dataclass(frozen=True)
class RunState:
    """One run of a kind on disk: its verified JSON (None when damaged), its status and
    what is wrong with it (None when ok)."""

    run: str
    meta: dict[str, Any] | None
    status: Status
    problem: IntegrityError | None


def run_states(root: Path, kind: str) -> list[RunState]:
    """Every run of one kind, sorted, with its status: "ok"; "damaged" (a file of the run, or
    the kind's runs.json, fails verification); or "unregistered", a run on disk that the
    kind's runs.json does not list, its problem naming the command that registers it again.
    Every file of every run is verified (`store.analysis_runs.verify_run`, hashes cached per
    file version), so a deleted or changed file shows instead of a run going missing."""
    kind_dir = AtlasLayout(root).analysis_dir(kind)
    try:
        registered, unregistered = list_runs(root, kind), unregistered_runs(root, kind)
    except IntegrityError as exc:  # the kind's runs.json itself is damaged
        return [RunState(p.stem, None, "damaged", exc) for p in sorted(kind_dir.glob("*.json"))
                if p.name != RUNS_FILE]
    states = []
    for run in sorted(registered + unregistered):
        verify = verify_run_files if run in unregistered else verify_run
        try:
            meta = verify(root, kind, run)
        except IntegrityError as exc:
            states.append(RunState(run, None, "damaged", exc))
            continue
        states.append(RunState(run, meta, "unregistered", unregistered_run(root, kind, run))
                      if run in unregistered else RunState(run, meta, "ok", None))
    return states


def analysis_runs(root: Path) -> list[AnalysisRunFiles]:
    """Every stored analysis run: kind, run, its table and figure file names, and `status`
    and `problem` as `run_states` gives them (the problem: the file, what is wrong and the
    repair, or the command that registers the run again)."""
    return [_run_row(AtlasLayout(root).analysis_dir(kind), state.run, state.meta, state.status, state.problem)
            for kind in analysis_kinds(root) for state in run_states(root, kind)]


def _run_row(kind_dir: Path, run: str, meta: dict[str, Any] | None, state: Status,
             problem: IntegrityError | None) -> AnalysisRunFiles:
    """A listing row; the files come from the verified JSON, or by name for a damaged run or
    one written before figures were recorded."""
    main = ((meta or {}).get("tables") or {}).get(MAIN)
    figures = figure_names(meta or {})
    if meta is None or "figure_sha256" not in meta:
        figures = sorted(p.name for p in kind_dir.glob("*.png") if p.name == f"{run}.png"
                         or p.name.startswith(f"{run}."))
    table = main["file"] if main else f"{run}.parquet" if (kind_dir / f"{run}.parquet").exists() else None
    return AnalysisRunFiles(kind=kind_dir.name, run=run, table=table, figures=figures, status=state,
                            problem=None if problem is None else problem.describe(kind_dir.parent.parent))


def analysis_run(root: Path, kind: str, run: str) -> tuple[AnalysisRunFiles, dict[str, Any], pl.DataFrame | None]:
    """`(files, meta, table)` of one run, every file verified (`store.analysis_runs.read_analysis`);
    NotFoundError names the runs of that kind and the kinds."""
    kind_dir = AtlasLayout(root).analysis_dir(kind)
    try:
        stored = read_analysis(root, kind, check_id(run, "run name"))
    except NotFoundError as exc:
        kinds = sorted({r["kind"] for r in analysis_runs(root)})
        raise NotFoundError(f"{exc}; kinds: {', '.join(kinds) or '(none)'}") from exc
    return _run_row(kind_dir, run, stored.meta, "ok", None), stored.meta, stored.table


def figure_path(root: Path, kind: str, name: str) -> Path:
    """The path of a PNG under `analyses/<kind>/` after checking it against the sha256 its
    run recorded (NotFoundError if no run has it; IntegrityError if it is damaged). Runs
    written before figures were recorded serve theirs unverified."""
    kind_dir = AtlasLayout(root).analysis_dir(kind)
    path = kind_dir / check_id(name, "figure name")
    if name.endswith(".png"):
        owner = figure_owner(root, kind, name)  # verifies the owner's files, this one included
        if owner is not None and name in owner[1].get("figure_sha256", {}):
            return path
        if path.is_file() and any(name == f"{run}.png" or name.startswith(f"{run}.")
                                  for run in _runs_without_figure_checksums(root, kind)):
            return path
    raise NotFoundError(f"no figure {name!r} under analyses/{kind}")


def _runs_without_figure_checksums(root: Path, kind: str) -> list[str]:
    return [run for run in list_runs(root, kind)
            if "figure_sha256" not in verify_run(root, kind, run)]


A = TypeVar("A", bound=AnalysisResult)


def analysis(root: Path, kind: str, run: str) -> AnalysisResult:
    """One geometry result: its parameters/summary (json), table and figure paths, as the
    kind's result type (`api.results.analysis.KIND_TYPES`; `AnalysisResult` for the others)."""
    return analysis_as(KIND_TYPES.get(kind, AnalysisResult), root, kind, run)


def analysis_as(result_type: type[A], root: Path, kind: str, run: str) -> A:
    """One geometry result as `result_type` (the typed result of the method that wrote it)."""
    files, meta, table = analysis_run(root, kind, run)
    folder = AtlasLayout(root).analysis_dir(kind)
    return result_type(kind=kind, run=run, meta=meta, table=table, figures=[folder / name for name in files["figures"]])


def with_run_labels(ctx: AtlasContext, result: AnalysisResult) -> AnalysisResult:
    """`result` with a `label` column after `latent` when its table's rows name latents of
    this atlas's SAEs (an `sae_id` column, or the run's `sae_id` parameter); labels of SAEs
    not registered here, or whose files cannot be read, stay null."""
    table = result.table
    if table is None or "latent" not in table.columns or "label" in table.columns:
        return result
    sae_id = result.meta.get("parameters", {}).get("sae_id")
    if "sae_id" not in table.columns and not isinstance(sae_id, str):
        return result
    ids = table["sae_id"] if "sae_id" in table.columns else pl.Series("sae_id", [sae_id] * table.height)
    keys = pl.DataFrame({"sae_id": ids.cast(pl.String), "latent": table["latent"].cast(pl.Int64)})
    known = keys.filter(pl.col("sae_id").is_in(ctx.sae_ids())).unique()
    try:
        labelled = with_labels(ctx, known).select("sae_id", "latent", pl.col("label").cast(pl.String))
    except (IntegrityError, NotFoundError):  # a damaged SAE: the run still reads, unlabelled
        labelled = known.with_columns(pl.lit(None, pl.String).alias("label"))
    column = keys.join(labelled, on=["sae_id", "latent"], how="left", maintain_order="left")["label"]
    at = table.columns.index("latent") + 1
    result.table = table.insert_column(at, column)
    return result


def run_circular(view: SaeView, params: CircularParams) -> CircularDiscovery:
    """Run circular-feature discovery on one SAE (`api.analyses.circular`), the top tokens as
    strings of the atlas's model's tokenizer when `params.token_strings`; the new result."""
    from sae_atlas.saes.summary.logits import vocab_strings

    vocab = None
    if params.token_strings:
        tokenizer = view.ctx.model().tokenizer
        vocab = list(vocab_strings(tokenizer, len(tokenizer)))
    options = DiscoveryParams(method=params.method, k=params.k, threshold=params.threshold,
                              n_clusters=params.n_clusters or None, min_tokens=params.min_tokens, seed=params.seed)
    _, meta_path = discover_for_sae(view.ctx.root, view.sae_id, options, run=params.run, split=params.split,
                                    max_tokens=params.max_tokens, vocab=vocab)
    return analysis_as(CircularDiscovery, view.ctx.root, meta_path.parent.name, meta_path.stem)

