"""The CLI layer of `index`; its other layers: `sae_atlas.store.index` (persistence).

`sae-atlas index ATLAS`: build or repair the FAISS indexes of an atlas."""

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
from sae_atlas.store.index_params import APPROX_THRESHOLD


@handle_errors
def index_command(
    atlas: Path | None = atlas_argument(),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    saes: list[str] = typer.Option([], "--sae", help="SAE id (repeatable); default: every SAE."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Rebuild even indexes that verify."),
    approx_threshold: int = typer.Option(APPROX_THRESHOLD, help="Rows from which the index is approximate (IVF)."),
    seed: int = typer.Option(0, help="Seed of IVF training and the recall sample."),
    json_out: bool = typer.Option(False, "--json", help="Print the index descriptions as JSON."),
) -> None:
    """Index unit decoder rows per SAE and model-wide; keeps indexes that are current (a thin
    call of `Atlas.index`; the parameters: `api.operations.build.IndexParams`)."""
    infos = open_atlas(the_atlas(atlas, old_atlas)).index(list(saes) or None, rebuild=rebuild,
                                                          approx_threshold=approx_threshold, seed=seed)
    if json_out:
        print_json(infos)
        return
    print_table("FAISS indexes", ["index", "type", "rows", "recall@10", "build s", "status"], [
        (info.get("sae_id", "model-wide"), info["type"], info["n"], info["recall_at_10"],
         info["build_seconds"], "built" if info["rebuilt"] else "current")
        for info in infos
    ])


def register(app: typer.Typer) -> None:
    """Add the `index` verb."""
    app.command("index")(index_command)
