"""`sae-atlas import ATLAS SOURCE`: bring a pretrained SAE into an atlas (with the misload
guard); a thin call of `Atlas.add_sae` (the parameters: `api.operations.importing.ImportParams`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from sae_atlas.errors import InvalidInputError

DEFAULT_ATLAS = Path("atlas-demo")


def _atlas_and_source(first: Path | None, source: str | None, old_atlas: Path | None) -> tuple[Path, str]:
    """The atlas and SOURCE of `import ATLAS SOURCE`, or of the old spellings `import SOURCE
    --atlas ATLAS` and `import SOURCE` (the atlas then atlas-demo; a warning)."""
    if source is None and first is not None:
        if old_atlas is None:
            typer.secho(f"warning: give the atlas first: `sae-atlas import {DEFAULT_ATLAS} {first}`", fg="yellow",
                        err=True)
        return the_atlas(None, old_atlas, DEFAULT_ATLAS), str(first)
    if source is None:
        raise InvalidInputError("missing SOURCE: `sae-atlas import ATLAS SOURCE`")
    return the_atlas(first, old_atlas), source


@handle_errors
def import_command(
    atlas: Path | None = atlas_argument(),
    source: str = typer.Argument(None, show_default=False,
                                 help="A folder (SAELens, Gemma Scope, Llama Scope, sparsify, dictionary_learning), "
                                 "a circuit-tracer layer file beside its config.yaml, RELEASE/SAE_ID from the "
                                 "registry, or hf://org/repo/path[@revision]."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    hook: str | None = typer.Option(None, help="Hook the SAE reads (TransformerLens, SAELens or HF module name); "
                                    "default: the one it records."),
    sae_id: str | None = typer.Option(None, "--id", help="Id in the atlas (default: <hook>-<architecture>-<d_sae>-<source>)."),
    link: bool = typer.Option(False, "--link", help="Symlink the weights instead of copying (unconverted SAELens files only)."),
    force: bool = typer.Option(False, "--force", help="Keep an SAE the misload guard refuses, marked suspect."),
    registry: Path | None = typer.Option(None, help="Registry YAML in SAELens' pretrained_saes.yaml schema."),
    with_model: bool = typer.Option(True, "--with-model/--no-model", help="CE loss recovered (--no-model: skip it, "
                                    "no model forward passes)."),
    clt: bool = typer.Option(False, "--clt", help="SOURCE is a circuit-tracer cross-layer transcoder (detected "
                             "by itself for a local folder)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Import a pretrained SAE, evaluate it on the hook's held-out activations and register it.
    A circuit-tracer cross-layer transcoder is judged on tokens streamed through the model
    and stored under clts/<id>/."""
    root, source = _atlas_and_source(atlas, source, old_atlas)
    result = open_atlas(root).add_sae(source, hook=hook, sae_id=sae_id, link=link, force=force, registry=registry,
                                      with_model=with_model, clt=clt)
    if json_out:
        print_json(result)
        return
    print_table(f"Imported into {root}", *_table(result))
    for problem in result["problems"]:
        typer.secho(f"suspect ({problem['cause']}): {problem['message']}", fg="yellow", err=True)


def _table(result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The import's one-row table: an SAE's or a cross-layer transcoder's."""
    metrics = result["metrics"]
    scores = [metrics.get("fvu"), metrics.get("l0"), metrics.get("dead_fraction"), metrics.get("ce_loss_score", "-"),
              result["suspect"]]
    if "clt_id" in result:
        return (["CLT", "layers", "reads", "FVU", "L0", "dead", "CE recovered", "suspect"],
                [[result["clt_id"], len(result["hooks_in"]), result["hooks_in"][0].split(".", 2)[-1], *scores]])
    return (["SAE", "hook", "architecture", "FVU", "L0", "dead", "CE recovered", "suspect"],
            [[result["sae_id"], result["hook"], result["architecture"], *scores]])


def register(app: typer.Typer) -> None:
    """Add the `import` verb."""
    app.command("import")(import_command)
