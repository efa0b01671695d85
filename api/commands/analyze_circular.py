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

from sae_atlas.api.commands.common import handle_errors, print_json, print_table
from sae_atlas.saes.models import DEFAULT_MODEL
from sae_atlas.store.errors import InvalidInputError
from sae_atlas.store.layout import AtlasLayout


def _int_list(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise InvalidInputError(f"{what} must be comma-separated integers, got {text!r}") from exc


@handle_errors
def discover_command(
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: str = typer.Option(..., help="SAE id in the atlas."),
    method: str = typer.Option("graph", help="graph (kNN cosine components) or spectral."),
    k: int = typer.Option(2, min=1, help="graph: neighbours per feature."),
    threshold: float = typer.Option(0.5, help="graph: cosine cutoff of an edge."),
    n_clusters: int = typer.Option(0, min=0, help="spectral: number of clusters (0: min(F // 20, 256))."),
    split: str = typer.Option("heldout", help="Cached split to encode: heldout, train or all."),
    max_tokens: int = typer.Option(200_000, min=1, help="Tokens to encode."),
    min_tokens: int = typer.Option(32, min=4, help="Skip clusters firing on fewer tokens."),
    seed: int = typer.Option(0, help="Seed of spectral clustering and subsamples."),
    run: str = typer.Option("", help="Run name (default <sae>-<method>)."),
    token_strings: bool = typer.Option(False, help="Load the atlas model's tokenizer to show token strings."),
    top: int = typer.Option(10, min=1, help="Rows to print."),
    json_out: bool = typer.Option(False, "--json", help="Print the top rows as JSON."),
) -> None:
    """Find and rank multi-dimensional feature clusters of one SAE."""
    from sae_atlas.api.analyses.circular import discover_for_sae
    from sae_atlas.geometry.circular_discovery import DiscoveryParams
    from sae_atlas.saes.models import load_model
    from sae_atlas.saes.summary.logits import vocab_strings

    params = DiscoveryParams(method=method, k=k, threshold=threshold, n_clusters=n_clusters or None,
                             min_tokens=min_tokens, seed=seed)
    vocab = None
    if token_strings:
        tok = load_model(AtlasLayout(atlas).read_meta()["model"]).tokenizer
        vocab = list(vocab_strings(tok, len(tok)))
    result, js = discover_for_sae(atlas, sae, params, run=run or None, split=split,
                                  max_tokens=max_tokens, vocab=vocab)
    cols = ["rank", "cluster_id", "size", "n_tokens", "score", "top_token_strs" if vocab else "top_token_ids"]
    head = result.table.head(top).select(cols)
    if json_out:
        print_json({"run": str(js), "summary": result.summary, "top": head.to_dicts()})
        return
    rows = [[*r[:-1], ", ".join(map(str, r[-1][:5]))] for r in head.iter_rows()]
    print_table(f"circular clusters of {sae} ({result.summary['n_scored']} scored)", cols, rows)
    typer.echo(f"stored {js} ({result.summary['seconds_total']} s)")


@handle_errors
def concept_command(
    concept: str = typer.Option("weekdays", help="weekdays, months or a JSON file {name, values, templates, offsets}."),
    model: str = typer.Option("", help=f"Model spec (default: the --atlas's model, else {DEFAULT_MODEL})."),
    layers: str = typer.Option("3,6,9,12", help="Comma-separated layers to probe (resid_post)."),
    n_components: int = typer.Option(5, min=2, help="Principal components fed to the probe."),
    intervene_layer: int = typer.Option(-1, help="Layer to intervene at (-1: none)."),
    shifts: str = typer.Option("", help="Target shifts in steps (default 1..p-1)."),
    atlas: Path = typer.Option(None, help="Atlas to store the run and figures in (optional)."),
    run: str = typer.Option("", help="Run name (default <concept>-<model>)."),
    seed: int = typer.Option(0, help="Seed of the random-subspace baseline."),
    spectra: bool = typer.Option(False, help="Fourier spectra against the concept index (best layer, or --sae's layer)."),
    sae: str = typer.Option("", help="With --spectra and --atlas: use this SAE's features (its layer must be probed)."),
    json_out: bool = typer.Option(False, "--json", help="Print results as JSON."),
) -> None:
    """Circle probe per layer on a cyclic concept, an optional intervention, and optional
    periodic spectra of residual dimensions or SAE features."""
    from sae_atlas.api.analyses.circular import (
        METHODS,
        concept_spectra,
        run_circle_analysis,
        run_intervention,
        spectra_summary,
        write_concept_run,
    )
    from sae_atlas.saes.atlas_saes import load_atlas_sae
    from sae_atlas.saes.intervene.concepts import load_concept
    from sae_atlas.saes.models import load_model

    handle = load_model(model or (AtlasLayout(atlas).read_meta()["model"] if atlas is not None else DEFAULT_MODEL))
    c = load_concept(concept)
    analysis = run_circle_analysis(handle, c, _int_list(layers, "--layers"), n_components=n_components)
    spec_summary = None
    if spectra:
        sae_obj, layer = None, analysis.best_layer
        if sae:
            if atlas is None:
                raise InvalidInputError("--sae needs --atlas")
            sae_obj = load_atlas_sae(atlas, sae)
            layer = handle.hook_layer(handle.check_hook(sae_obj.cfg.hook_name))
            if layer not in analysis.probes:
                raise InvalidInputError(f"SAE {sae!r} reads layer {layer}; add it to --layers")
        spec_summary = {"layer": layer, "sae": sae or None,
                        **spectra_summary(*concept_spectra(analysis, layer, sae_obj))}
    result = None
    if intervene_layer >= 0:
        result = run_intervention(handle, analysis, intervene_layer, shifts=_int_list(shifts, "--shifts") or None,
                                  methods=METHODS, seed=seed)
    stored = None
    if atlas is not None:
        name = run or f"{c.name}-{handle.name}".replace("/", "_")
        stored = write_concept_run(atlas, name, analysis, result, model=handle.name,
                                   extra={"spectra": spec_summary} if spec_summary else None)
    if json_out:
        print_json({"layers": analysis.table().to_dicts(), "best_layer": analysis.best_layer,
                    "intervention": None if result is None else {"clean": result.clean, "by_method": result.by_method()},
                    "spectra": spec_summary,
                    "stored": None if stored is None else str(stored)})
        return
    table = analysis.table()
    print_table(f"circle probe: {c.name} on {handle.name}", ["layer", "r2", "r2_loo", "r2_null", "cyclic", "period"],
                table.select("layer", "r2", "r2_loo", "r2_null", "cyclic_order", "fitted_period").iter_rows())
    if result is not None:
        agg = result.by_method()
        cols = [k for k in next(iter(agg.values()))]
        print_table(f"intervention at layer {intervene_layer} (mean over shifts)", ["method", *cols],
                    [[m, *(agg[m][k] for k in cols)] for m in agg])
    if spec_summary is not None:
        print_table(f"features by dominant period (layer {spec_summary['layer']})", ["period", "features", "top"],
                    [[p, g["n_features"], ", ".join(map(str, g["top_features"][:5]))]
                     for p, g in spec_summary["by_period"].items()])
    if stored is not None:
        typer.echo(f"stored {stored}")


def register_analyze(analyze_app: typer.Typer) -> None:
    """Add `circular discover` and `circular concept` under the `analyze` sub-app."""
    circular = typer.Typer(help="Multi-dimensional (circular) features.", no_args_is_help=True)
    circular.command("discover")(discover_command)
    circular.command("concept")(concept_command)
    analyze_app.add_typer(circular, name="circular")
