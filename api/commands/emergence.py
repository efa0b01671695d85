"""The CLI layer of `emergence`; its other layers: `sae_atlas.api.services.emergence` (service),
`sae_atlas.geometry.emergence` (maths).

`sae-atlas emergence ATLAS[:SAE] ATLAS[:SAE] ... [--concept weekdays ...]`: per concept, at
which member of a series of SAEs (checkpoints, layers or sizes) its features first reach a
selectivity or probe threshold, and where they fall below and re-appear; a table, `--json`,
a stored run (`analyses/emergence/` of the first member's atlas) and a heat map."""

from __future__ import annotations

import typer

from sae_atlas.api.commands.common import console, handle_errors, print_json, print_table
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.geometry.emergence_options import DEFAULT_CONCEPTS, METRICS

SCORES = ["auroc", "latent", "k1_accuracy", "probe_accuracy", "baseline", "value_selectivity", "value_latent"]


@handle_errors
def emergence_command(
    members: list[str] = typer.Argument(..., metavar="ATLAS[:SAE]...",
                                        help="The series in order, e.g. A:sae8 A:sae15 A:sae22 or checkpoints."),
    concepts: list[str] = typer.Option(list(DEFAULT_CONCEPTS), "--concept",
                                       help="weekdays, months, numbers, colours or a JSON file (repeatable)."),
    metric: str = typer.Option("auroc", help=f"Score the threshold applies to: {', '.join(METRICS)}."),
    threshold: float = typer.Option(0.9, help="A member 'has' the concept when its score reaches this."),
    test_frac: float = typer.Option(0.25, help="Held-out share of the prompts (between 0 and 1)."),
    seed: int = typer.Option(0, help="Seed of the train / held-out split."),
    run: str = typer.Option(None, help="Run name (default <concepts>--<saes>)."),
    json_out: bool = typer.Option(False, "--json", help="Print the stored run as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Where each concept's features emerge over a series of SAEs: per member the held-out
    AUROC of the best single latent, the k=1 sparse-probe and full-probe accuracies (concept
    prompts against the same templates with other words); first member at the threshold,
    gaps and re-appearances. The options are `api.operations.concepts_across.EmergenceParams`,
    checked there (as `Atlas.emergence`)."""
    from sae_atlas.api.operations.concepts_across import EmergenceParams
    from sae_atlas.api.services.compare import open_side
    from sae_atlas.api.services.emergence import run_emergence
    from sae_atlas.saes.devices import use_by_default

    params = EmergenceParams.of(concepts=concepts, metric=metric, threshold=threshold, test_frac=test_frac,
                                seed=seed, run=run)
    where = use_by_default(device, model_dtype)
    first = open_side(members[0])
    views = [first, *(open_side(m, near=first.ctx) for m in members[1:])]
    result = run_emergence(views, params, device=str(where))
    if json_out:
        print_json(result.to_dict())
        return
    s = result.meta["summary"]
    table = result.table
    for name in table["concept"].unique(maintain_order=True):
        part = table.filter(table["concept"] == name)
        print_table(f"{name} ({s['metric']} >= {s['threshold']:g} marked *)", ["member", *SCORES, "reached"],
                    ([r["member"], *(r[c] for c in SCORES), "*" if r["reached"] else ""]
                     for r in part.iter_rows(named=True)))
    print_table("onsets", ["concept", "first", "gaps", "reappears", "stable_from", "best", "best_score"],
                ([o["concept"], o["first"], ", ".join(o["gaps"]), ", ".join(o["reappears"]), o["stable_from"],
                  o["best"], o["best_score"]] for o in s["onsets"]))
    atlas = result.meta["parameters"]["members"][0]["atlas"]
    console.print(f"stored analyses/emergence/{result.run}.json and {result.figures[0].name} in {atlas}")


def register(app: typer.Typer) -> None:
    """Add the `emergence` verb."""
    app.command("emergence")(emergence_command)
