"""`sae-atlas steering-search --atlas A TARGET`: features ranked by their measured effect
toward a token, a set of tokens, a concept or a contrast of two text sets, each with a
calibrated strength and a ready edit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from api.commands.common import handle_errors, open_atlas, print_json, print_table
from api.commands.search import _read_texts
from store.errors import InvalidInputError


def command_target(tokens: list[str], as_ids: bool, concept: str | None, contrast_a: str | None,
                   contrast_b: str | None) -> Any:
    """The target the options name: exactly one of TOKENS, --concept, --contrast-a/-b."""
    given = [bool(tokens), concept is not None, contrast_a is not None or contrast_b is not None]
    if sum(given) != 1:
        raise InvalidInputError("give exactly one target: TOKEN(S), --concept NAME, or --contrast-a FILE "
                                "--contrast-b FILE")
    if concept is not None:
        return {"kind": "concept", "concept": concept}
    if given[2]:
        if contrast_a is None or contrast_b is None:
            raise InvalidInputError("a contrast needs both --contrast-a FILE and --contrast-b FILE")
        return {"kind": "contrast", "texts_a": _read_texts(contrast_a), "texts_b": _read_texts(contrast_b)}
    if as_ids:
        try:
            return [int(t) for t in tokens]
        except ValueError as exc:
            raise InvalidInputError(f"--id: every TOKEN must be an integer id, got {tokens}") from exc
    return list(tokens)


@handle_errors
def steering_search_command(
    tokens: list[str] = typer.Argument(None, help="Target token(s) as written in text, e.g. ' Friday' "
                                       "(each one vocabulary token), or ids with --id."),
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: list[str] = typer.Option([], help="SAE to search (repeatable); default: every SAE."),
    as_ids: bool = typer.Option(False, "--id", help="TOKENS are token ids."),
    concept: str = typer.Option(None, help="Target a concept's values: weekdays, months, colours or a JSON file."),
    contrast_a: str = typer.Option(None, help="Target texts A (a .json list or one text per line) ..."),
    contrast_b: str = typer.Option(None, help="... against texts B."),
    mode: str = typer.Option("add", help="add (steer with the decoder row) or clamp (set the latent)."),
    ratio: float = typer.Option(3.0, help="Probability ratio of the target the calibrated strength must reach."),
    kl_bound: float = typer.Option(1.0, help="Bound on the KL (nats) over the rest of the next-token distribution."),
    k: int = typer.Option(10, "-k", "--k", min=1, max=100, help="Features to return."),
    candidates: int = typer.Option(24, min=1, help="Candidates screened per SAE."),
    prompts: int = typer.Option(16, min=1, help="Held-out neutral prompts."),
    seed: int = typer.Option(None, help="Seed of the held-out prompts (default: one past the steering tables')."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Rank features by what steering them does to the target (not by activation): steered
    at the last token of held-out neutral prompts, with the smallest strength reaching
    --ratio under --kl-bound and its ready edit. Needs `sae-atlas steering-scores`."""
    target = command_target(list(tokens or []), as_ids, concept, contrast_a, contrast_b)
    result = open_atlas(atlas).steering_features(target, saes=list(sae) or None, k=k, mode=mode, ratio=ratio,
                                            kl_bound=kl_bound, n_prompts=prompts, seed=seed, candidates=candidates)
    if json_out:
        print_json(result.to_dict())
        return
    print_table(
        f"steering toward {result.target} ({result.mode}; ratio {result.ratio_requested:g} under KL "
        f"{result.kl_bound:g}; {result.n_prompts} held-out prompts, seed {result.seed})",
        ["rank", "sae", "latent", "label", "ratio", "best", "reached", "kl_rest", "alpha", "x act", "x norm",
         "ppl", "p clean", "p steered"],
        [(r["rank"], r["sae_id"], r["latent"], r["label"] or "", r["ratio"], r["best_ratio"], r["reached"],
          r["kl_rest"], r["strength"]["alpha"], r["strength"]["act_multiple"], r["strength"]["norm_fraction"],
          r["perplexity"], r["p_clean"], r["p_steered"]) for r in result.features])
    if result.features:
        typer.echo(f"ready edit: {result.features[0]['edit']}  (unedited perplexity {result.baseline_perplexity})")


def register(app: typer.Typer) -> None:
    """Add the `steering-search` verb."""
    app.command("steering-search")(steering_search_command)
