"""The CLI layer of `steer_bench`; its other layers: `sae_atlas.saes.intervene.steer_bench`
(engine).

`sae-atlas steer-bench ATLAS`: an AxBench-style steering benchmark inside the tool.
For each target, the best-ranked SAE feature (added and clamped), the top-activating
feature, a difference-of-means direction, a probe direction, a random feature of matched
norm and prompting, each scored on the target's probability ratio against the KL on the
rest of the distribution; a table, `--json`, a results file and a plot."""

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
)
from sae_atlas.api.commands.steering_search import atlas_and_tokens, command_target
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.steering_prompts import PROMPT_STYLES
from sae_atlas.store.atomic import atomic_write_json, remove_temporaries

DEFAULT_TARGETS = [" Monday", " Friday", " March", " July", " seven", " three", " red", " dog"]
ACCEPTANCE_SHARE = 0.75


def bench_targets(tokens: list[str], concept: list[str], contrast_a: str | None, contrast_b: str | None) -> list[Any]:
    """One target per TOKEN (or the defaults: days, months, numbers, colours, animals), per
    --concept, and the contrast of --contrast-a / --contrast-b."""
    targets: list[Any] = list(tokens) + [{"kind": "concept", "concept": c} for c in concept]
    if contrast_a is not None or contrast_b is not None:
        targets.append(command_target([], False, None, contrast_a, contrast_b))
    return targets or list(DEFAULT_TARGETS)


@handle_errors
def steer_bench_command(
    atlas: Path | None = atlas_argument(),
    targets: list[str] = typer.Argument(None, metavar="[TOKEN]...", help="Target tokens, one benchmark target each "
                                        "(default: " + ", ".join(repr(t) for t in DEFAULT_TARGETS) + ")."),
    saes: list[str] = typer.Option(None, "--sae", help="SAE to search (repeatable; default: every SAE)."),
    concept: list[str] = typer.Option([], help="Also a concept target: weekdays, months, colours or a JSON file."),
    contrast_a: str = typer.Option(None, help="Also a contrast target: texts A (a .json list or one per line) ..."),
    contrast_b: str = typer.Option(None, help="... against texts B."),
    ratio: float = typer.Option(3.0, help="Probability ratio each arm's calibrated strength must reach."),
    kl_bound: float = typer.Option(1.0, help="Bound on the KL (nats) over the rest of the next-token distribution."),
    n_prompts: int = typer.Option(16, "--n-prompts", "--prompts", help="Held-out ranking prompts."),
    candidates: int = typer.Option(24, help="Candidates screened per SAE for the best feature."),
    prompt_prefix: str = typer.Option("Let's talk about {target}.", "--prompt-prefix", "--prefix",
                                      help="Prompting arm: text put before each prompt."),
    confirm_prompts: int = typer.Option(16, help="Held-out neutral prompts every arm is counted on."),
    styles: list[str] = typer.Option(list(PROMPT_STYLES), "--style", help="Prompt style to rank and confirm on "
                                     "(repeatable): " + ", ".join(PROMPT_STYLES) + "."),
    prompts: Path = typer.Option(None, "--prompts-file", help="Your own prompts (one per line or a JSON list): half "
                                 "rank, half confirm."),
    combine: int = typer.Option(3, help="Features in the fitted combination arm (0: no such arm)."),
    out: Path = typer.Option(None, help="Write the results here (JSON)."),
    plot: Path = typer.Option(None, help="Write the ratio-vs-KL plot here (PNG; needs matplotlib)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
) -> None:
    """Compare steering directions toward each target at matched norms: each calibrated on
    the ranking prompts, counted on held-out prompts of each style (needs the SAEs'
    summaries and `sae-atlas steering-scores`). The options are
    `api.operations.steering.SteerBenchParams`, checked there (as `Atlas.steer_bench`)."""
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise InvalidInputError("--plot needs matplotlib (pip install matplotlib)") from exc
    root, tokens = atlas_and_tokens(atlas, old_atlas, targets)
    result = open_atlas(root).steer_bench(
        bench_targets(tokens, list(concept), contrast_a, contrast_b), saes=saes or None, ratio=ratio,
        kl_bound=kl_bound, n_prompts=n_prompts, candidates=candidates, prompt_prefix=prompt_prefix,
        confirm_prompts=confirm_prompts, styles=styles, prompts=prompts or (), combine=combine)  # type: ignore[arg-type]
    if out is not None:  # atomically, first removing what a killed write of it left (as the plot does)
        remove_temporaries(out)
        atomic_write_json(out, json.loads(json.dumps(result.to_dict())))
    if plot is not None:
        result.plot(plot)
    if json_out:
        print_json(result.to_dict())
        return
    print_table(f"steer-bench: ratio {ratio:g} under KL {kl_bound:g}, per target (held-out prompts)",
                ["target", "arm", "feature", "x norm", "ratio", "95% interval", "kl_rest", "pairs reached",
                 "specific", "siblings", "matched ratio"],
                [(r["target"], r["arm"], _feature(r), r["norm_fraction"], r["confirmed"]["ratio"],
                  f"{r['confirmed']['ratio_low']:.3g}-{r['confirmed']['ratio_high']:.3g}", r["kl_rest"],
                  r["confirmed"]["share_reached"], r["confirmed"]["share_specific"], r["confirmed"]["sibling_ratio"],
                  r["matched_ratio"]) for r in result.arms])
    print_table(f"share of (target, prompt) pairs reaching {ratio:g}x with KL on the rest <= {kl_bound:g} "
                f"({len(dict.fromkeys(r['target'] for r in result.arms))} targets; 95% bootstrap intervals)",
                ["arm", "style", "pairs", "reached", "share", "interval"],
                [(s["arm"], s["style"], s["pairs"], s["reached"], s["share"],
                  f"{s['share_low']:.2f}-{s['share_high']:.2f}") for s in result.shares])
    sae_arms = ("top_result", "feature_add", "feature_clamp", "combination")
    met = [s["arm"] for s in result.shares if s["style"] == "all" and s["share"] >= ACCEPTANCE_SHARE]
    typer.echo(f"arms reaching {ratio:g}x on >= {ACCEPTANCE_SHARE:.0%} of pairs: {', '.join(met) or 'none'}; "
               + ("the top result of steering-search meets this bar" if "top_result" in met
                  else "the top result of steering-search does NOT meet this bar")
               + ("" if any(a in sae_arms for a in met) else "; no SAE-based arm meets it"))


def _feature(row: dict[str, Any]) -> str:
    if row["latents"]:
        return f"{row['sae_id']}/" + "+".join(map(str, row["latents"]))
    return "" if row["latent"] is None else f"{row['sae_id']}/{row['latent']}"


def register(app: typer.Typer) -> None:
    """Add the `steer-bench` verb."""
    app.command("steer-bench")(steer_bench_command)
