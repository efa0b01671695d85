"""The CLI layer of `steering_search`; its other layers: `sae_atlas.saes.intervene.steering_search`
(engine).

`sae-atlas steering-search ATLAS TARGET`: features ranked by their measured effect
toward a token, a set of tokens, a concept or a contrast of two text sets, each with a
calibrated strength and a ready edit."""

from __future__ import annotations

import json
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
from sae_atlas.api.commands.search import _read_texts
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.steering_prompts import BUILTIN_CATEGORIES, PROMPT_STYLES


def _category(spec: str | None) -> Any:
    """A built-in category name, or the category a JSON file holds."""
    if spec is None or spec in BUILTIN_CATEGORIES:
        return spec
    path = Path(spec)
    if not path.is_file():
        raise InvalidInputError(f"unknown category {spec!r}: use {', '.join(BUILTIN_CATEGORIES)} or a JSON file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InvalidInputError(f"category file {spec!r} is not JSON: {exc}") from exc


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


def atlas_and_tokens(atlas: Path | None, old_atlas: Path | None, tokens: list[str] | None) -> tuple[Path, list[str]]:
    """The atlas and the TOKEN arguments; with the deprecated `--atlas`, the first argument
    is a token."""
    if old_atlas is not None and atlas is not None:
        return the_atlas(None, old_atlas), [str(atlas), *(tokens or [])]
    return the_atlas(atlas, old_atlas), list(tokens or [])


@handle_errors
def steering_search_command(
    atlas: Path | None = atlas_argument(),
    target: list[str] = typer.Argument(None, metavar="[TOKEN]...", help="Target token(s) as written in text, e.g. "
                                       "' Friday' (each one vocabulary token), or ids with --id."),
    saes: list[str] = typer.Option(None, "--sae", help="SAE to search (repeatable; default: every SAE)."),
    as_ids: bool = typer.Option(False, "--id", help="TOKENS are token ids."),
    concept: str = typer.Option(None, help="Target a concept's values: weekdays, months, colours or a JSON file."),
    contrast_a: str = typer.Option(None, help="Target texts A (a .json list or one text per line) ..."),
    contrast_b: str = typer.Option(None, help="... against texts B."),
    mode: str = typer.Option("add", help="add (steer with the decoder row) or clamp (set the latent)."),
    ratio: float = typer.Option(3.0, help="Probability ratio of the target the calibrated strength must reach."),
    kl_bound: float = typer.Option(1.0, help="Bound on the KL (nats) over the rest of the next-token distribution."),
    k: int = typer.Option(10, "-k", "--k", help="Features to return."),
    candidates: int = typer.Option(24, help="Candidates screened per SAE."),
    n_prompts: int = typer.Option(16, "--n-prompts", "--prompts", help="Held-out ranking prompts."),
    seed: int = typer.Option(None, help="Seed of the ranking prompts (default: one past the steering tables')."),
    confirm_prompts: int = typer.Option(16, help="Held-out neutral prompts the ranking is confirmed on."),
    styles: list[str] = typer.Option(list(PROMPT_STYLES), "--style", help="Prompt style to rank and confirm on "
                                     "(repeatable): " + ", ".join(PROMPT_STYLES) + "."),
    prompts: Path = typer.Option(None, "--prompts-file", help="Your own prompts (one per line or a JSON list): half "
                                 "rank, half confirm."),
    category: str = typer.Option(None, help="The target's class for in-context prompts and siblings: "
                                 + ", ".join(BUILTIN_CATEGORIES) + " or a JSON file {name, values, templates, "
                                 "questions} (default: the built-in one listing the token)."),
    include_dead: bool = typer.Option(False, "--include-dead", "--directions", help="Also rank dead and near-dead "
                                      "latents (below the density floor), as directions."),
    combine: int = typer.Option(3, help="Features in the fitted sparse combination (0: none)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
) -> None:
    """Rank features by what steering them does to the target (not by activation): steered
    at the last token of ranking prompts, with the smallest strength reaching --ratio under
    --kl-bound, then ranked by what that edit does on disjoint confirmation prompts of each
    style. Needs `sae-atlas steering-scores`. The options are
    `api.operations.steering.SteeringSearchParams`, checked there (as
    `Atlas.steering_features` and `POST /steering/search`)."""
    root, tokens = atlas_and_tokens(atlas, old_atlas, target)
    goal = command_target(tokens, as_ids, concept, contrast_a, contrast_b)
    result = open_atlas(root).steering_features(
        goal, saes=saes or None, k=k, mode=mode, ratio=ratio, kl_bound=kl_bound, n_prompts=n_prompts,  # type: ignore[arg-type]
        seed=seed, candidates=candidates, confirm_prompts=confirm_prompts, styles=styles,  # type: ignore[arg-type]
        prompts=prompts or (), category=_category(category), include_dead=include_dead, combine=combine)
    if json_out:
        print_json(result.to_dict())
        return
    counts = "; ".join(f"{name}: " + ", ".join(f"{n} {s}" for s, n in by.items())
                       for name, by in result.prompt_counts.items())
    print_table(
        f"steering toward {result.target} ({result.mode}; ratio {result.ratio_requested:g} under KL "
        f"{result.kl_bound:g}; prompts {counts}; ranked by the confirmation prompts)",
        ["rank", "sae", "latent", "kind", "label", "density", "confirmed", "95% interval", "pairs reached",
         "specific", "siblings", "target rank", "ratio (ranking)", "kl_rest", "x norm", "ppl"],
        [(r["rank"], r["sae_id"], r["latent"], r["kind"], r["label"] or "", r["density"], r["confirmed"]["ratio"],
          f"{r['confirmed']['ratio_low']:.3g}-{r['confirmed']['ratio_high']:.3g}", r["confirmed"]["share_reached"],
          r["confirmed"]["share_specific"], r["sibling_ratio"], r["target_rank"], r["ratio"], r["kl_rest"],
          r["strength"]["norm_fraction"], r["perplexity"]) for r in result.features])
    dead = (f"{result.left_out_dead} latents below the density floor {result.density_floor:g} left out "
            "(--directions ranks them)" if not result.include_dead
            else f"latents below the density floor {result.density_floor:g} are ranked as directions")
    typer.echo(dead)
    combo = result.combination
    if combo is not None:
        parts = ", ".join(f"{w:+.3g} x {combo['sae_id']}/{i} ({label or ''})"
                          for i, w, label in zip(combo["latents"], combo["weights"], combo["labels"], strict=True))
        typer.echo(f"fitted combination: {parts}; confirmed x{combo['confirmed']['ratio']:.3g} "
                   f"({combo['confirmed']['ratio_low']:.3g}-{combo['confirmed']['ratio_high']:.3g}), pairs reached "
                   f"{combo['confirmed']['share_reached']:.2f}")
    for style, stats in (result.features[0]["confirmed_styles"] if result.features else {}).items():
        typer.echo(f"top feature on {style} prompts: x{stats['ratio']:.3g} ({stats['ratio_low']:.3g}-"
                   f"{stats['ratio_high']:.3g}), pairs reached {stats['share_reached']:.2f} of {stats['n_prompts']}")
    if result.features:
        typer.echo(f"best on the confirmation prompts: {result.best}; ready edits: {result.best_edits}  "
                   f"(unedited perplexity {result.baseline_perplexity})")


def register(app: typer.Typer) -> None:
    """Add the `steering-search` verb."""
    app.command("steering-search")(steering_search_command)
