"""`sae-atlas steer ATLAS TEXT`: generate without and with feature edits (same seed)."""

from __future__ import annotations

import json
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
from sae_atlas.errors import InvalidInputError


def parse_json_edits(edits: list[str]) -> list[dict]:
    """`--edit` options: each a JSON object such as `{"kind": "clamp", "sae": ..., ...}`."""
    out = []
    for text in edits:
        try:
            out.append(json.loads(text))
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"--edit {text!r} is not valid JSON: {exc}") from exc
    return out


@handle_errors
def steer_command(
    atlas: Path | None = atlas_argument(),
    text: str = typer.Argument(..., help="The prompt."),
    edits: list[str] = typer.Option(None, "--edit", help='An edit as JSON, e.g. \'{"kind": "clamp", "sae": "S", '
                                    '"feature": 3, "value": 5}\' (repeatable).'),
    saes: list[str] = typer.Option(None, "--sae", help="SAE spliced in (repeatable; default: every SAE); with "
                                   "--feature, the one SAE of the feature."),
    feature: int = typer.Option(None, help="Feature of the one --sae to steer with (besides the edits)."),
    alpha: float = typer.Option(4.0, help="The feature's steering strength: alpha x its decoder row."),
    at: str = typer.Option("all", help="Positions of the feature's steer: all or last."),
    max_new_tokens: int = typer.Option(20, help="Tokens to generate."),
    temperature: float = typer.Option(0.0, help="0: greedy; >0: sampled with --seed."),
    seed: int = typer.Option(0, help="Seed of sampling."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
) -> None:
    """Baseline vs edited continuation and the next-token distribution shift. The options
    are `api.operations.interventions.SteerParams`, checked there (as `Atlas.steer` and
    `POST /steer`)."""
    result = open_atlas(the_atlas(atlas, old_atlas)).steer(
        text, parse_json_edits(edits or []), saes=saes or None, feature=feature, alpha=alpha, at=at,  # type: ignore[arg-type]
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    if json_out:
        print_json(result.to_dict())
        return
    typer.echo(str(result).split("\nKL")[0])
    typer.echo(f"KL(baseline || edited) = {result.kl:.4g}")
    print_table("next token: rising", ["token", "p_baseline", "p_edited"],
                [[repr(r["token"]), r["p_baseline"], r["p_edited"]] for r in result.rising[:8]])
    print_table("next token: falling", ["token", "p_baseline", "p_edited"],
                [[repr(r["token"]), r["p_baseline"], r["p_edited"]] for r in result.falling[:8]])


def register(app: typer.Typer) -> None:
    """Add the `steer` verb."""
    app.command("steer")(steer_command)
