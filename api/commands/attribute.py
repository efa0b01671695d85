"""`sae-atlas attribute ATLAS TEXT --target TOKEN`: which features drive a prediction."""

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
def attribute_command(
    atlas: Path | None = atlas_argument(),
    text: str = typer.Argument(..., help="The prompt."),
    target: str = typer.Option(None, help="Target token (exactly one token, e.g. ' Friday')."),
    other: str = typer.Option(None, help="With --kind logit_diff: the token subtracted."),
    kind: str = typer.Option("logit", help="logit, logit_diff or loss."),
    position: int = typer.Option(-1, help="Position whose prediction is the target."),
    saes: list[str] = typer.Option(None, "--sae", help="SAE to attribute to (repeatable; default: every SAE)."),
    top: int = typer.Option(20, help="Features to list."),
    verify: int = typer.Option(5, help="Top features checked by true ablation."),
    mode: str = typer.Option("linearized", help="linearized (parts sum to the target) or gradient (model's own)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
) -> None:
    """Activation x gradient attribution through the spliced SAEs, with the completeness
    check and the top features' true ablation effects. The options are
    `api.operations.interventions.AttributeParams`, checked there (as `Atlas.attribute` and
    `POST /attribute`)."""
    spec = {"kind": kind, "token": target, "other": other, "position": position}
    result = open_atlas(the_atlas(atlas, old_atlas)).attribute(text, spec, saes=saes or None, top=top, verify=verify,
                                                               mode=mode)  # type: ignore[arg-type]
    if json_out:
        print_json(result.to_dict())
        return
    typer.echo(f"target {kind} {target!r}{'' if other is None else ' - ' + repr(other)} = {result.total:.4g}")
    print_table("top features", ["sae_id", "feature", "attribution", "max_act", "token"],
                [[f["sae_id"], f["feature"], f["attribution"], f["max_act"], repr(result.tokens[f["top_position"]])]
                 for f in result.features])
    # the verdict comes first so that a narrow table, which leaves out right-most columns, keeps it
    print_table("completeness (parts sum to the target)", ["sae_id", "ok", "sum", "total", "features", "error",
                                                          "sae_bias", "model_bias"],
                [[p["sae_id"], p["ok"], p["sum"], p["total"], p["features"], p["error"], p["sae_bias"],
                  p["model_bias"]] for p in result.parts])
    if result.verification:
        print_table("attribution vs true ablation effect", ["sae_id", "feature", "attribution", "ablation_effect"],
                    [[v["sae_id"], v["feature"], v["attribution"], v["ablation_effect"]] for v in result.verification])
        typer.echo("agreement: " + ", ".join(f"{k} {v:.3g}" for k, v in result.agreement.items()))


def register(app: typer.Typer) -> None:
    """Add the `attribute` verb."""
    app.command("attribute")(attribute_command)
