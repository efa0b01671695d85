"""`sae-atlas register`: record again the SAEs and analysis runs that are on disk but that
atlas.json or their kind's runs.json does not list (`Atlas.saes()`, `Atlas.analyses()`
and the server's `/health` report them as "unregistered")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from sae_atlas.api.commands.common import handle_errors, print_json, print_table
from sae_atlas.store.errors import AtlasError, InvalidInputError
from sae_atlas.store.layout import AtlasLayout


def _run_name(text: str) -> tuple[str, str]:
    """`KIND/RUN` as (kind, run)."""
    kind, slash, run = text.partition("/")
    if not slash or not kind or not run or "/" in run:
        raise InvalidInputError(f"--analysis takes KIND/RUN (e.g. circular/my-run), got {text!r}")
    return kind, run


def _everything(atlas: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Every unregistered SAE id and (kind, run)."""
    from sae_atlas.geometry.results import analysis_kinds, unregistered_runs

    runs = [(kind, run) for kind in analysis_kinds(atlas) for run in unregistered_runs(atlas, kind)]
    return AtlasLayout(atlas).unregistered_sae_ids(), runs


def _attempt(what: str, name: str, register: Callable[[], Any]) -> dict[str, str]:
    """One registration as a report row: "registered", or the error that refused it."""
    try:
        register()
    except AtlasError as exc:
        return {"what": what, "name": name, "result": f"refused: {exc}"}
    return {"what": what, "name": name, "result": "registered"}


@handle_errors
def register_command(
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: list[str] = typer.Option([], help="SAE id whose folder atlas.json does not list (repeatable)."),
    analysis: list[str] = typer.Option([], help="Analysis run KIND/RUN its runs.json does not list (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Register SAE folders and analysis runs again after checking their files: an SAE's
    atlas.json record is rebuilt from its cfg.json and training.json (or source.json and
    eval.json); a run's JSON is added to its kind's runs.json once its tables and figures
    verify. Without --sae or --analysis, everything unregistered. Exits 2 if any is refused."""
    from sae_atlas.geometry.results import register_run
    from sae_atlas.saes.registry import register_sae

    runs = [_run_name(text) for text in analysis]
    if not sae and not analysis:
        sae, runs = _everything(atlas)
    report = [_attempt("sae", sae_id, lambda sae_id=sae_id: register_sae(atlas, sae_id)) for sae_id in sae]
    report += [_attempt("analysis", f"{kind}/{run}", lambda kind=kind, run=run: register_run(atlas, kind, run))
               for kind, run in runs]
    if json_out:
        print_json(report)
    elif report:
        print_table("Registration", ["what", "name", "result"], [row.values() for row in report])
    else:
        typer.echo("nothing to register: every SAE and analysis run on disk is registered")
    if any(row["result"] != "registered" for row in report):
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add the `register` verb."""
    app.command("register")(register_command)
