"""The service layer of `registration`; its other layers: `sae_atlas.api.results.registration`
(typed-result).

Registering again what is on disk but not listed: SAE folders atlas.json lacks
(`saes.atlas_records.register_sae`) and analysis runs their kind's runs.json lacks
(`store.analysis_runs.register_run`), each after its files are checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.importing import RegisterParams
from sae_atlas.api.results.registration import Registration
from sae_atlas.errors import AtlasError, InvalidInputError
from sae_atlas.saes.atlas_records import register_sae
from sae_atlas.store.analysis_runs import analysis_kinds, register_run, unregistered_runs


def run_name(text: str) -> tuple[str, str]:
    """`KIND/RUN` as (kind, run)."""
    kind, slash, run = text.partition("/")
    if not slash or not kind or not run or "/" in run:
        raise InvalidInputError(f"--analysis takes KIND/RUN (e.g. circular/my-run), got {text!r}")
    return kind, run


def _attempt(what: Literal["sae", "analysis"], name: str, register: Callable[[], Any]) -> Registration:
    """One registration as a report row: "registered", or the error that refused it."""
    try:
        register()
    except AtlasError as exc:
        return {"what": what, "name": name, "result": f"refused: {exc}"}
    return {"what": what, "name": name, "result": "registered"}


def register(ctx: AtlasContext, params: RegisterParams) -> list[Registration]:
    """Register the named SAEs and runs (with neither named: every unregistered one); a row
    per attempt. A refusal does not stop the others."""
    sae_ids, runs = list(params.saes or []), [run_name(text) for text in params.analyses or []]
    if not sae_ids and not runs:
        sae_ids = ctx.layout.unregistered_sae_ids()
        runs = [(kind, run) for kind in analysis_kinds(ctx.root) for run in unregistered_runs(ctx.root, kind)]
    report = [_attempt("sae", sae_id, lambda sae_id=sae_id: register_sae(ctx.root, sae_id)) for sae_id in sae_ids]
    report += [_attempt("analysis", f"{kind}/{run}", lambda kind=kind, run=run: register_run(ctx.root, kind, run))
               for kind, run in runs]
    ctx.reread_meta()
    return report
