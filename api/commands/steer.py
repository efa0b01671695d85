"""`sae-atlas steer ATLAS TEXT`: generate without and with feature edits (same seed)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sae_atlas.api.commands.common import handle_errors, open_atlas, print_json, print_table
from sae_atlas.store.errors import InvalidInputError


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
    atlas: Path = typer.Argument(..., help="Atlas directory."),
    text: str = typer.Argument(..., help="The prompt."),
    sae: str = typer.Option(None, help="SAE of the feature to steer with."),
    feature: int = typer.Option(None, min=0, help="Feature index to steer with (with --sae)."),
    alpha: float = typer.Option(4.0, help="Steering strength: alpha x the feature's decoder row."),
    at: str = typer.Option("all", help="Positions of the --sae/--feature steer: all or last."),
    edit: list[str] = typer.Option(None, "--edit", help='More edits as JSON, e.g. \'{"kind": "clamp", '
                                   '"sae": "S", "feature": 3, "value": 5}\' (repeatable).'),
    max_new_tokens: int = typer.Option(20, min=1, help="Tokens to generate."),
    temperature: float = typer.Option(0.0, min=0.0, help="0: greedy; >0: sampled with --seed."),
    seed: int = typer.Option(0, help="Seed of sampling."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Baseline vs edited continuation and the next-token distribution shift."""
    edits = parse_json_edits(edit or [])
    if (sae is None) != (feature is None):
        raise InvalidInputError("give --sae and --feature together")
    if sae is not None:
        edits.insert(0, {"kind": "steer", "sae": sae, "feature": feature, "alpha": alpha, "at": at})
    result = open_atlas(atlas).steer(text, edits, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
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
