"""`sae-atlas steer-bench --atlas A`: an AxBench-style steering benchmark inside the tool.
For each target, the best-ranked SAE feature (added and clamped), the top-activating
feature, a difference-of-means direction, a probe direction, a random feature of matched
norm and prompting, each scored on the target's probability ratio against the KL on the
rest of the distribution; a table, `--json`, a results file and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from api.commands.common import handle_errors, open_atlas, print_json, print_table
from api.commands.steering_search import command_target
from store.atomic import atomic_write_json
from store.errors import InvalidInputError

DEFAULT_TARGETS = [" Monday", " Friday", " March", " seven", " three"]


def bench_targets(tokens: list[str], concept: list[str], contrast_a: str | None, contrast_b: str | None) -> list[Any]:
    """One target per TOKEN (or the defaults: days, months, numbers), per --concept, and
    the contrast of --contrast-a / --contrast-b."""
    targets: list[Any] = list(tokens) + [{"kind": "concept", "concept": c} for c in concept]
    if contrast_a is not None or contrast_b is not None:
        targets.append(command_target([], False, None, contrast_a, contrast_b))
    return targets or list(DEFAULT_TARGETS)


@handle_errors
def steer_bench_command(
    tokens: list[str] = typer.Argument(None, help="Target tokens, one benchmark target each (default: "
                                       + ", ".join(repr(t) for t in DEFAULT_TARGETS) + ")."),
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: list[str] = typer.Option([], help="SAE to search (repeatable); default: every SAE."),
    concept: list[str] = typer.Option([], help="Also a concept target: weekdays, months, colours or a JSON file."),
    contrast_a: str = typer.Option(None, help="Also a contrast target: texts A (a .json list or one per line) ..."),
    contrast_b: str = typer.Option(None, help="... against texts B."),
    ratio: float = typer.Option(3.0, help="Probability ratio each arm's calibrated strength must reach."),
    kl_bound: float = typer.Option(1.0, help="Bound on the KL (nats) over the rest of the next-token distribution."),
    prompts: int = typer.Option(16, min=1, help="Held-out neutral prompts."),
    candidates: int = typer.Option(24, min=1, help="Candidates screened per SAE for the best feature."),
    prefix: str = typer.Option("Let's talk about {target}.", help="Prompting arm: text put before each prompt."),
    out: Path = typer.Option(None, help="Write the results here (JSON)."),
    plot: Path = typer.Option(None, help="Write the ratio-vs-KL plot here (PNG; needs matplotlib)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Compare steering directions toward each target at matched norms on held-out neutral
    prompts (needs the SAEs' summaries and `sae-atlas steering-scores`)."""
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise InvalidInputError("--plot needs matplotlib (pip install matplotlib)") from exc
    targets = bench_targets(list(tokens or []), list(concept), contrast_a, contrast_b)
    result = open_atlas(atlas).steer_bench(targets, saes=list(sae) or None, ratio=ratio, kl_bound=kl_bound,
                                      n_prompts=prompts, candidates=candidates, prompt_prefix=prefix)
    if out is not None:
        atomic_write_json(out, json.loads(json.dumps(result.to_dict())))
    if plot is not None:
        result.plot(plot)
    if json_out:
        print_json(result.to_dict())
        return
    print_table(f"steer-bench: ratio {ratio:g} under KL {kl_bound:g} ({prompts} held-out prompts)",
                ["target", "arm", "feature", "reached", "x norm", "ratio", "kl_rest", "best ratio", "matched ratio",
                 "matched kl_rest"],
                [(r["target"], r["arm"], "" if r["latent"] is None else f"{r['sae_id']}/{r['latent']}", r["reached"],
                  r["norm_fraction"], r["ratio"], r["kl_rest"], r["best_ratio"], r["matched_ratio"],
                  r["matched_kl_rest"]) for r in result.arms])


def register(app: typer.Typer) -> None:
    """Add the `steer-bench` verb."""
    app.command("steer-bench")(steer_bench_command)
