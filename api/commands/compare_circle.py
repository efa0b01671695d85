"""`sae-atlas compare-circle A[:SAE] B[:SAE] --circle circular/<run>`: does a circle found in
A exist in B? Fits the stored run's concept circle again in B (and A), beside nulls, and
stores the run in A's atlas (`analyses/circle_transfer/`)."""

from __future__ import annotations

import typer

from sae_atlas.api.commands.common import console, handle_errors, print_json, print_table
from sae_atlas.api.commands.device_options import device_option, model_dtype_option

COLUMNS = ["side", "space", "dimension", "r2", "r2_loo", "null_mean", "p_value", "cyclic_order", "fitted_period",
           "order_matches_a", "order"]
HEADERS = ["side", "space", "dim", "R^2", "R^2 loo", "null", "p", "cyclic", "period", "A's order", "order"]


def short_names(names: list[str]) -> dict[str, str]:
    """Each value's first three characters when those tell them apart, else the value."""
    short = {n: n[:3] for n in names}
    return short if len(set(short.values())) == len(names) else {n: n for n in names}


@handle_errors
def compare_circle_command(
    side_a: str = typer.Argument(..., metavar="A[:SAE]", help="Atlas holding the circle run, and its SAE."),
    side_b: str = typer.Argument(None, metavar="[B[:SAE]]", help="Atlas and SAE to look in (or --model-b)."),
    circle: str = typer.Option(..., "--circle", help="A's stored run: circular/<run> (a concept run) or "
                                                     "concept_search/<run> (an ordered concept)."),
    model_b: str = typer.Option(None, help="Look in this model's activations instead of an atlas (a Hugging "
                                           "Face id or folder, a .gguf, tiny JSON)."),
    hook_b: str = typer.Option(None, help="With --model-b: the hook (default A's SAE's hook)."),
    n_components: int = typer.Option(5, help="Principal components fed to the circle probe (at least 2)."),
    n_null: int = typer.Option(200, help="Relabelled-value draws of the probe nulls (at least 1)."),
    n_random: int = typer.Option(50, help="Random-direction spans of the span null (at least 0)."),
    alpha: float = typer.Option(0.05, help="p-value at which B counts as holding the circle (between 0 and 1)."),
    seed: int = typer.Option(0, help="Seed of the nulls."),
    run: str = typer.Option(None, help="Run name (default <concept>-<sae_a>--<B>)."),
    json_out: bool = typer.Option(False, "--json", help="Print the stored run as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Fit the circle of A's stored concept run in B and in A: circle-probe R^2 on the
    activations, on the concept search's span of SAE features, and (same width) A's probe and
    span read unchanged on B, each beside its null, with the cyclic order and period. The
    options are `api.operations.concepts_across.CircleTransferParams`, checked there (as
    `Atlas.compare_circle`)."""
    from sae_atlas.api.operations.concepts_across import CircleTransferParams
    from sae_atlas.api.services.circle_transfer import run_circle_transfer
    from sae_atlas.api.services.compare import open_side
    from sae_atlas.saes.devices import use_by_default

    params = CircleTransferParams.of(circle=circle, model_b=model_b, hook_b=hook_b, n_components=n_components,
                                     n_null=n_null, n_random=n_random, alpha=alpha, seed=seed, run=run)
    where = use_by_default(device, model_dtype)
    a = open_side(side_a)
    result = run_circle_transfer(a, open_side(side_b, near=a.ctx) if side_b is not None else None, params,
                                 device=str(where))
    if json_out:
        print_json(result.to_dict())
        return
    p, s = result.meta["parameters"], result.meta["summary"]
    short = short_names(p["concept"]["values"])
    rows = ([*r[:-1], " ".join(short[v] for v in r[-1] or [])] for r in result.table.select(COLUMNS).iter_rows())
    print_table(f"{p['concept']['name']} circle of {p['a']['label']} in {p['b']['label']}", HEADERS, rows)
    console.print("null: relabelled values (residual, a_probe; p of R^2), random directions (span, a_span; p of "
                  "R^2 loo)")
    console.print(f"found in B (p <= {s['alpha']} in A's cyclic order): {s['found_in_b']}")
    console.print(f"stored analyses/circle_transfer/{result.run}.json in {p['a']['atlas']}")


def register(app: typer.Typer) -> None:
    """Add the `compare-circle` verb."""
    app.command("compare-circle")(compare_circle_command)
