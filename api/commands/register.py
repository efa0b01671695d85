"""`sae-atlas register ATLAS`: record again the SAEs and analysis runs that are on disk but
that atlas.json or their kind's runs.json does not list (`Atlas.saes()`, `Atlas.analyses()`
and the server's `/health` report them as "unregistered"); a thin call of `Atlas.register`."""

from __future__ import annotations

from pathlib import Path

import typer

from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    handle_errors,
    open_atlas,
    print_json,
    print_table,
    the_atlas,
)


@handle_errors
def register_command(
    atlas: Path | None = atlas_argument(),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    saes: list[str] = typer.Option([], "--sae", help="SAE id whose folder atlas.json does not list (repeatable)."),
    analyses: list[str] = typer.Option([], "--analysis", help="Analysis run KIND/RUN its runs.json does not list "
                                       "(repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Register SAE folders and analysis runs again after checking their files: an SAE's
    atlas.json record is rebuilt from its cfg.json and training.json (or source.json and
    eval.json); a run's JSON is added to its kind's runs.json once its tables and figures
    verify. Without --sae or --analysis, everything unregistered. Exits 2 if any is refused."""
    report = open_atlas(the_atlas(atlas, old_atlas)).register(saes=list(saes) or None,
                                                              analyses=list(analyses) or None)
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
