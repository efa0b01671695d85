"""The service layer of `saes`; its other layers: `sae_atlas.api.http.routers.saes` (HTTP).

The SAEs of an atlas: listing with status, damage and registration reports, import and
preload."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.importing import ImportParams
from sae_atlas.api.results.build import Imported
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.sae import SaeStatus, Status
from sae_atlas.api.sae_view import open_sae
from sae_atlas.errors import IntegrityError
from sae_atlas.saes.atlas_records import folder_record
from sae_atlas.saes.importing.pipeline import import_sae
from sae_atlas.store.steering import STEERING_META

RECORDED_KEYS = ("hook", "hook_out", "architecture", "d_in", "d_sae", "k", "fvu", "l0", "dead_fraction")


def problem_of(ctx: AtlasContext, sae_id: str) -> IntegrityError | None:
    """The SAE's damage (`SaeView.damage`), or the IntegrityError of one registered in
    atlas.json whose cfg.json is missing."""
    try:
        return open_sae(ctx, sae_id).damage()
    except IntegrityError as exc:
        return exc


def status(ctx: AtlasContext, sae_id: str) -> SaeStatus:
    """The SAE's facts plus `status` "ok"; for a damaged SAE what atlas.json records of it,
    `status` "damaged" and the `problem` (the file, what is wrong, the repair); for an SAE
    folder atlas.json does not list, the record `sae-atlas register` would write for it,
    `status` "unregistered" and the `problem` naming that command (or, when the folder
    cannot be registered, why)."""
    problem = problem_of(ctx, sae_id)
    if problem is not None:
        return _row(sae_id, ctx.recorded(sae_id), "damaged", ctx.describe(problem))
    view = open_sae(ctx, sae_id)
    steering = (view.folder / STEERING_META).is_file()
    if sae_id in ctx.layout.registered_sae_ids():
        return SaeStatus(**view.info, steering_table=steering, status="ok", problem=None)
    try:
        record = folder_record(view.folder, sae_id)
    except IntegrityError as exc:
        return SaeStatus(**view.info, steering_table=steering, status="unregistered", problem=ctx.describe(exc))
    return _row(sae_id, record, "unregistered", ctx.describe(ctx.layout.unregistered_sae(sae_id)), steering)


def _row(sae_id: str, record: dict[str, Any], state: Status, problem: str, steering: bool = False) -> SaeStatus:
    """A listing row from an atlas.json record (what it holds of the SAE's facts)."""
    return SaeStatus(sae_id=sae_id, **{key: record.get(key) for key in RECORDED_KEYS},
                     source=(record.get("source") or {}).get("source") or "trained",
                     suspect=bool(record.get("suspect")), steering_table=steering, status=state, problem=problem)


def listing(ctx: AtlasContext) -> Rows[SaeStatus]:
    """One row per SAE (`status`)."""
    return Rows.of(SaeStatus, [status(ctx, sae_id) for sae_id in ctx.sae_ids()])


def damaged(ctx: AtlasContext) -> dict[str, str]:
    """The damaged SAEs and what is wrong with each (atlas-relative file, problem, repair)."""
    return {sae_id: ctx.describe(problem) for sae_id in ctx.sae_ids() if (problem := problem_of(ctx, sae_id))}


def preload(ctx: AtlasContext) -> None:
    """Load what feature pages and searches read: every healthy SAE's tables, map and
    index, and the neighbour tables of every pair of indexed SAEs of one width."""
    broken = damaged(ctx)
    indexed = [s for s in ctx.sae_ids() if s not in broken and open_sae(ctx, s).has_index]
    search = ctx.search()
    width = {sae_id: search.sae_index(sae_id)[1]["d"] for sae_id in indexed}
    for source in indexed:
        for target in indexed:
            if width[source] == width[target]:
                search.neighbour_table(source, target)


def add_sae(ctx: AtlasContext, params: ImportParams) -> Imported:
    """Import a pretrained SAE into the atlas after the misload guard
    (`saes.importing.pipeline.import_sae`), or a circuit-tracer cross-layer transcoder
    (`saes.importing.clt.import_clt`: `params.clt`, or detected in a local folder), with
    the context's model; what was imported and its metrics."""
    from sae_atlas.saes.transcoders.circuit_tracer_clt import is_circuit_tracer_clt

    if params.clt or is_circuit_tracer_clt(Path(params.source)):
        from sae_atlas.saes.importing.clt import import_clt

        result = ctx.run_locked(lambda: import_clt(ctx.root, params.source, clt_id=params.sae_id, force=params.force,
                                                   model_handle=ctx.model()))
    else:
        result = ctx.run_locked(lambda: import_sae(
            ctx.root, params.source, hook=params.hook, sae_id=params.sae_id, link=params.link, force=params.force,
            registry=params.registry, with_model=params.with_model, model_loader=ctx.model))
    ctx.reread_meta()
    return cast(Imported, result.to_dict())
