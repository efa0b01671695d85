"""`sae-atlas import`: bring a pretrained SAE into an atlas (with the misload guard)."""

from __future__ import annotations

from pathlib import Path

import typer

from sae_atlas.api.commands.common import handle_errors, print_json, print_table


@handle_errors
def import_command(
    source: str = typer.Argument(..., help="A folder (SAELens, Gemma Scope, Llama Scope, sparsify, "
                                 "dictionary_learning), a circuit-tracer layer file beside its config.yaml, "
                                 "RELEASE/SAE_ID from the registry, or hf://org/repo/path[@revision]."),
    atlas: Path = typer.Option(Path("atlas-demo"), help="Atlas directory."),
    hook: str | None = typer.Option(None, help="Hook the SAE reads (TransformerLens, SAELens or HF module name); "
                                    "default: the one it records."),
    sae_id: str | None = typer.Option(None, "--id", help="Id in the atlas (default: <hook>-<architecture>-<d_sae>-<source>)."),
    link: bool = typer.Option(False, "--link", help="Symlink the weights instead of copying (unconverted SAELens files only)."),
    force: bool = typer.Option(False, "--force", help="Keep an SAE the misload guard refuses, marked suspect."),
    registry: Path | None = typer.Option(None, help="Registry YAML in SAELens' pretrained_saes.yaml schema."),
    no_model: bool = typer.Option(False, "--no-model", help="Skip CE loss recovered (no model forward passes)."),
    clt: bool = typer.Option(False, "--clt", help="SOURCE is a circuit-tracer cross-layer transcoder (detected "
                             "by itself for a local folder)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Import a pretrained SAE, evaluate it on the hook's held-out activations and register it.
    A circuit-tracer cross-layer transcoder is judged on tokens streamed through the model
    and stored under clts/<id>/."""
    from sae_atlas.saes.formats.circuit_tracer_clt import is_circuit_tracer_clt
    from sae_atlas.saes.importing.pipeline import import_sae

    if clt or is_circuit_tracer_clt(Path(source)):
        _import_clt(atlas, source, sae_id, force, json_out)
        return

    result = import_sae(atlas, source, hook=hook, sae_id=sae_id, link=link, force=force,
                        registry=registry, with_model=not no_model).to_dict()
    if json_out:
        print_json(result)
        return
    metrics = result["metrics"]
    print_table(f"Imported into {atlas}", ["SAE", "hook", "architecture", "FVU", "L0", "dead", "CE recovered", "suspect"],
                [[result["sae_id"], result["hook"], result["architecture"], metrics.get("fvu"), metrics.get("l0"),
                  metrics.get("dead_fraction"), metrics.get("ce_loss_score", "-"), result["suspect"]]])
    for problem in result["problems"]:
        typer.secho(f"suspect ({problem['cause']}): {problem['message']}", fg="yellow", err=True)


def _import_clt(atlas: Path, source: str, clt_id: str | None, force: bool, json_out: bool) -> None:
    from sae_atlas.saes.importing.clt import import_clt

    result = import_clt(atlas, source, clt_id=clt_id, force=force).to_dict()
    if json_out:
        print_json(result)
        return
    metrics = result["metrics"]
    print_table(f"Imported into {atlas}", ["CLT", "layers", "reads", "FVU", "L0", "dead", "CE recovered", "suspect"],
                [[result["clt_id"], len(result["hooks_in"]), result["hooks_in"][0].split(".", 2)[-1], metrics["fvu"],
                  metrics["l0"], metrics["dead_fraction"], metrics.get("ce_loss_score", "-"), result["suspect"]]])
    for problem in result["problems"]:
        typer.secho(f"suspect ({problem['cause']}): {problem['message']}", fg="yellow", err=True)


def register(app: typer.Typer) -> None:
    """Add the `import` verb."""
    app.command("import")(import_command)
