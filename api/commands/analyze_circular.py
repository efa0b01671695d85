"""`sae-atlas analyze circular ...`: multi-dimensional (circular) features.

- `discover`: cluster an SAE's features by decoder direction, score each cluster's
  reconstruction for irreducibility and store the ranked table (`analyses/circular/`);
- `concept`: fit a circle probe per layer on a cyclic concept (weekdays, months or a JSON
  file with values + templates) and, with `--intervene-layer`, move the concept along the
  fitted circle and compare the answer change with baselines.
"""

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
from sae_atlas.saes.models import DEFAULT_MODEL
from sae_atlas.store.layout import AtlasLayout


@handle_errors
def discover_command(
    atlas: Path = atlas_argument(),
    old_atlas: Path = OLD_ATLAS_OPTION,
    sae_id: str = typer.Option(..., "--sae", help="SAE id in the atlas."),
    method: str = typer.Option("graph", help="graph (kNN cosine components) or spectral."),
    k: int = typer.Option(2, help="graph: neighbours per feature (1 to 1000)."),
    threshold: float = typer.Option(0.5, help="graph: cosine cutoff of an edge (-1 to 1)."),
    n_clusters: int = typer.Option(0, help="spectral: number of clusters (0: min(F // 20, 256))."),
    split: str = typer.Option("heldout", help="Cached split to encode: heldout, train or all."),
    max_tokens: int = typer.Option(200_000, help="Tokens to encode (at least 1)."),
    min_tokens: int = typer.Option(32, help="Skip clusters firing on fewer tokens (at least 4)."),
    seed: int = typer.Option(0, help="Seed of spectral clustering and subsamples."),
    run: str = typer.Option(None, help="Run name (default <sae>-<method>)."),
    token_strings: bool = typer.Option(False, help="Load the atlas model's tokenizer to show token strings."),
    top: int = typer.Option(10, min=1, help="Rows to print."),
    json_out: bool = typer.Option(False, "--json", help="Print the top rows as JSON."),
) -> None:
    """Find and rank multi-dimensional feature clusters of one SAE. The options are
    `api.operations.analyses.CircularParams`, checked there (as `Atlas.run_circular`)."""
    root = the_atlas(atlas, old_atlas)
    result = open_atlas(root).run_circular(sae_id, method=method, k=k, threshold=threshold, n_clusters=n_clusters,
                                           split=split, max_tokens=max_tokens, min_tokens=min_tokens, seed=seed,
                                           run=run, token_strings=token_strings)
    assert result.table is not None  # a discovery run always stores its ranked table
    cols = ["rank", "cluster_id", "size", "n_tokens", "score", "top_token_strs" if token_strings else "top_token_ids"]
    head = result.table.head(top).select(cols)
    stored = AtlasLayout(root).analysis_dir(result.kind) / f"{result.run}.json"
    if json_out:
        print_json({"run": str(stored), "summary": result.meta["summary"], "top": head.to_dicts()})
        return
    rows = [[*r[:-1], ", ".join(map(str, r[-1][:5]))] for r in head.iter_rows()]
    print_table(f"circular clusters of {sae_id} ({result.meta['summary']['n_scored']} scored)", cols, rows)
    typer.echo(f"stored {stored} ({result.meta['summary']['seconds_total']} s)")


@handle_errors
def concept_command(
    atlas: Path = atlas_argument(help="Atlas to store the run and figures in (optional)."),
    old_atlas: Path = OLD_ATLAS_OPTION,
    concept: str = typer.Option("weekdays", help="weekdays, months or a JSON file {name, values, templates, offsets}."),
    model: str = typer.Option(None, help=f"Model spec (default: the atlas's model, else {DEFAULT_MODEL})."),
    layers: list[str] = typer.Option([3, 6, 9, 12], help="Layers to probe (resid_post; comma-separated or repeated)."),
    n_components: int = typer.Option(5, help="Principal components fed to the probe (2 to 64)."),
    intervene_layer: int = typer.Option(-1, help="Layer to intervene at (-1: none)."),
    shifts: list[str] = typer.Option([], help="Target shifts in steps (comma-separated or repeated; default 1..p-1)."),
    run: str = typer.Option(None, help="Run name (default <concept>-<model>)."),
    seed: int = typer.Option(0, help="Seed of the random-subspace baseline."),
    spectra: bool = typer.Option(False, help="Fourier spectra against the concept index (best layer, or --sae's layer)."),
    sae_id: str = typer.Option(None, "--sae", help="With --spectra and an atlas: use this SAE's features (its layer "
                               "must be probed)."),
    json_out: bool = typer.Option(False, "--json", help="Print results as JSON."),
) -> None:
    """Circle probe per layer on a cyclic concept, an optional intervention, and optional
    periodic spectra of residual dimensions or SAE features. The options are
    `api.operations.analyses.CircleConceptParams`, checked there (as `Atlas.circle_concept`);
    without an atlas nothing is stored."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.api.operations.analyses import CircleConceptParams
    from sae_atlas.api.services.circle_probe import run_circle_probe
    from sae_atlas.saes.models import load_model

    params = CircleConceptParams.of(concept=concept, model=model, layers=layers, n_components=n_components,
                                    intervene_layer=intervene_layer, shifts=shifts or None, run=run, seed=seed,
                                    spectra=spectra, sae_id=sae_id)
    root = the_atlas(atlas, old_atlas) if atlas is not None or old_atlas is not None else None
    if root is not None:  # the atlas need not have an atlas.json: the run is stored in its folder
        done = Atlas.create(root).circle_concept(**dict(params))
    else:
        done = run_circle_probe(load_model(params.model or DEFAULT_MODEL), params, None)
    if json_out:
        print_json(done.to_dict())
        return
    table = done.analysis.table()
    print_table(f"circle probe: {done.concept.name} on {done.model}", ["layer", "r2", "r2_loo", "r2_null", "cyclic",
                                                                       "period"],
                table.select("layer", "r2", "r2_loo", "r2_null", "cyclic_order", "fitted_period").iter_rows())
    if done.intervention is not None:
        agg = done.intervention.by_method()
        cols = list(next(iter(agg.values())))
        print_table(f"intervention at layer {params.intervene_layer} (mean over shifts)", ["method", *cols],
                    [[m, *(agg[m][k] for k in cols)] for m in agg])
    if done.spectra is not None:
        print_table(f"features by dominant period (layer {done.spectra['layer']})", ["period", "features", "top"],
                    [[p, g["n_features"], ", ".join(map(str, g["top_features"][:5]))]
                     for p, g in done.spectra["by_period"].items()])
    if done.stored is not None:
        typer.echo(f"stored {done.stored}")


def register_analyze(analyze_app: typer.Typer) -> None:
    """Add `circular discover` and `circular concept` under the `analyze` sub-app."""
    circular = typer.Typer(help="Multi-dimensional (circular) features.", no_args_is_help=True)
    circular.command("discover")(discover_command)
    circular.command("concept")(concept_command)
    analyze_app.add_typer(circular, name="circular")
