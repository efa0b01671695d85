"""`sae-atlas analyze hierarchy|probe|crystals|lobes|galaxy|map ATLAS`: hierarchical and
linear structure and feature maps (results under `analyses/<kind>/`, maps in `saes/<id>/`).

Each verb is a thin call of its `Atlas` method (`analyze_hierarchy`, `analyze_probe`,
`analyze_crystals`, `analyze_lobes`, `analyze_galaxy`, `build_maps`); the options are the
parameter objects of `api.operations.analyses`, checked there. `hierarchy` and `crystals`
also run without an atlas (on `--model`; nothing stored)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.api.results.analysis import AnalysisResult

MODEL_HELP = "Model spec (default: the atlas's model, else smollm2-135m)."


def _store_in(atlas: Path | None, old_atlas: Path | None) -> Atlas | None:
    """The atlas a verb that may run without one stores its run in (its folder need not hold
    an atlas.json), None when none is given."""
    if atlas is None and old_atlas is None:
        return None
    from sae_atlas.api.atlas import Atlas

    return Atlas.create(the_atlas(atlas, old_atlas))


def _stored(result: AnalysisResult, root: Path | None) -> str | None:
    return None if root is None or not result.run else str(root / "analyses" / result.kind / f"{result.run}.json")


@handle_errors
def hierarchy_command(
    atlas: Path = atlas_argument(help="Atlas to store the run in (optional without --sae)."),
    old_atlas: Path = OLD_ATLAS_OPTION,
    model: str = typer.Option(None, help=MODEL_HELP),
    tree: str = typer.Option("curated", help="curated, wordnet, or a JSON tree file."),
    metric: str = typer.Option("causal", help="causal (whitened unembedding) or euclidean."),
    estimator: str = typer.Option("lda", help="Concept vector estimator: lda or mean."),
    min_tokens: int = typer.Option(5, help="Drop concepts with fewer single-token words (at least 2)."),
    sae_id: str = typer.Option(None, "--sae", help="Also test this SAE's features matched to the concepts."),
    match: str = typer.Option("decoder", help="Feature matching: decoder or activation."),
    seed: int = typer.Option(0, help="Seed of splits and controls."),
    run: str = typer.Option(None, help="Run name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Parent-child orthogonality of concept vectors (Park et al. 2024), with controls."""
    from sae_atlas.api.operations.analyses import HierarchyParams
    from sae_atlas.api.services.geometry_runs import hierarchy
    from sae_atlas.saes.models import DEFAULT_MODEL, load_model

    params = HierarchyParams.of(model=model, tree=tree, metric=metric, estimator=estimator, min_tokens=min_tokens,
                                sae_id=sae_id, match=match, seed=seed, run=run)
    store = _store_in(atlas, old_atlas)
    result = (store.analyze_hierarchy(**dict(params)) if store is not None
              else hierarchy(load_model(params.model or DEFAULT_MODEL), params, None))
    summary = result.meta["summary"] if not sae_id else {"features": result.n_rows}
    if json_out:
        print_json({"params": result.meta["parameters"], "summary": summary,
                    "json_path": _stored(result, None if store is None else store.root)})
        return
    assert result.table is not None  # a hierarchy run keeps its edges (or matched features)
    columns = (["child", "parent", "child_latent", "parent_latent", "cos_child_parent", "cos_random_parent"] if sae_id
               else ["child", "parent", "n_child", "cos_child_parent", "cos_random_parent", "cos_shuffled"])
    print_table(f"hierarchy ({metric}, {estimator})", columns, result.table.select(columns).rows())
    print_table("summary", ["field", "value"], [(k, v) for k, v in summary.items()])


@handle_errors
def probe_command(
    atlas: Path = atlas_argument(help="Atlas directory with cached activations."),
    old_atlas: Path = OLD_ATLAS_OPTION,
    hooks: list[str] = typer.Option(..., help="Cached hooks, one probe each (comma-separated or repeated)."),
    target: str = typer.Option("position", help="position (ridge) or a curated concept name, e.g. animal."),
    sae_id: str = typer.Option(None, "--sae", help="SAE id for k-sparse probes on neurons vs latents (concept "
                                                   "targets)."),
    model: str = typer.Option(None, help="Model whose tokenizer defines a concept's tokens (default: the atlas's)."),
    max_tokens: int = typer.Option(20_000, help="Tokens per hook (at least 10)."),
    seed: int = typer.Option(0, help="Seed of the train/test split."),
    run: str = typer.Option(None, help="Run name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Linear probes per layer on cached activations."""
    from sae_atlas.store.analysis_runs import read_analysis

    root = the_atlas(atlas, old_atlas)
    result = open_atlas(root).analyze_probe(hooks, target=target, sae_id=sae_id, model=model, max_tokens=max_tokens,
                                            seed=seed, run=run)
    tables = read_analysis(root, result.kind, result.run).tables
    if json_out:
        print_json({"params": result.meta["parameters"], "tables": {k: v.to_dicts() for k, v in tables.items()}})
        return
    for name, table in tables.items():
        print_table(f"probe {target}: {name}", table.columns, table.rows())


@handle_errors
def crystals_command(
    atlas: Path = atlas_argument(help="Atlas directory to store the run in (optional)."),
    old_atlas: Path = OLD_ATLAS_OPTION,
    model: str = typer.Option(None, help=MODEL_HELP),
    hook: str = typer.Option(None, help="Residual hook to read words at (default: input embeddings W_E)."),
    n_null: int = typer.Option(50, help="Random-label null draws (at least 2)."),
    seed: int = typer.Option(0, help="Seed of the split and null."),
    run: str = typer.Option(None, help="Run name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Word-pair relation crystals: held-out LDA silhouette vs a random-label null."""
    from sae_atlas.api.operations.analyses import CrystalsParams
    from sae_atlas.api.services.geometry_runs import crystals
    from sae_atlas.saes.models import DEFAULT_MODEL, load_model

    params = CrystalsParams.of(model=model, hook=hook, n_null=n_null, seed=seed, run=run)
    store = _store_in(atlas, old_atlas)
    result = (store.analyze_crystals(**dict(params)) if store is not None
              else crystals(load_model(params.model or DEFAULT_MODEL), params, None))
    if json_out:
        print_json({"params": result.meta["parameters"], "summary": result.meta["summary"]})
        return
    print_table("crystals", ["field", "value"], list(result.meta["summary"].items()))


@handle_errors
def lobes_command(
    atlas: Path = atlas_argument(),
    old_atlas: Path = OLD_ATLAS_OPTION,
    sae_id: str = typer.Option(..., "--sae", help="SAE id (needs its feature summary's occurrence matrix)."),
    measure: str = typer.Option("jaccard", help="jaccard, dice, overlap or phi (clipped at 0)."),
    k: int = typer.Option(20, help="Co-occurrence neighbours kept per feature (at least 1)."),
    n_clusters: int = typer.Option(10, help="Number of lobes (at least 2)."),
    seed: int = typer.Option(0, help="Seed of spectral clustering and permutations."),
    run: str = typer.Option(None, help="Run name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Co-occurrence lobes compared with geometric clusters by AMI."""
    root = the_atlas(atlas, old_atlas)
    result = open_atlas(root).analyze_lobes(sae_id, measure=measure, k=k, n_clusters=n_clusters, seed=seed, run=run)
    comparison = result.meta["summary"]
    if json_out:
        print_json({"params": result.meta["parameters"], "comparison": comparison,
                    "json_path": _stored(result, root)})
        return
    print_table(f"lobes of {sae_id}", ["field", "value"], list(comparison.items()))


@handle_errors
def galaxy_command(
    atlas: Path = atlas_argument(),
    old_atlas: Path = OLD_ATLAS_OPTION,
    saes: list[str] = typer.Option([], "--sae", help="SAE ids (repeatable or comma-separated; default: all)."),
    seed: int = typer.Option(0, help="Seed of the TwoNN subsample."),
    run: str = typer.Option("galaxy", help="Run name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Decoder covariance power-law slope (ranks 10-150) and TwoNN dimension per SAE."""
    result = open_atlas(the_atlas(atlas, old_atlas)).analyze_galaxy(saes or None, seed=seed, run=run)
    assert result.table is not None  # a galaxy run stores one row per SAE
    if json_out:
        print_json({"params": result.meta["parameters"], "table": result.table.to_dicts()})
        return
    print_table("galaxy", result.table.columns, result.table.rows())


@handle_errors
def map_command(
    atlas: Path = atlas_argument(),
    old_atlas: Path = OLD_ATLAS_OPTION,
    saes: list[str] = typer.Option([], "--sae", help="SAE ids (repeatable or comma-separated; default: all)."),
    k_overlap: int = typer.Option(10, help="Neighbours checked by the kNN-overlap score (at least 1)."),
    n_neighbors: int = typer.Option(15, help="UMAP n_neighbors (at least 2)."),
    min_dist: float = typer.Option(0.1, help="UMAP min_dist (0 to 1)."),
    seed: int = typer.Option(0, help="UMAP seed."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """UMAP maps of each SAE into saes/<id>/map.parquet, with kNN overlap: of the unit decoder
    rows, and of the activation co-occurrence graph once the SAE is summarized."""
    built = open_atlas(the_atlas(atlas, old_atlas)).build_maps(saes or None, k_overlap=k_overlap,
                                                               n_neighbors=n_neighbors, min_dist=min_dist, seed=seed)
    if json_out:
        print_json({b.sae_id: {"summary": b.summary, "path": str(b.path)} for b in built})
        return
    rows: list[Any] = [(b.sae_id, b.summary["n_features"], b.summary["knn_overlap_mean"],
                        b.summary.get("cooccurrence", {}).get("knn_overlap_mean", "not built"), b.summary["chance"],
                        str(b.path)) for b in built]
    print_table("maps", ["sae", "features", "mean kNN overlap", "co-occurrence map's", "chance", "file"], rows)


def register_analyze(analyze_app: typer.Typer) -> None:
    """Add hierarchy, probe, crystals, lobes, galaxy and map to the `analyze` sub-app."""
    analyze_app.command("hierarchy")(hierarchy_command)
    analyze_app.command("probe")(probe_command)
    analyze_app.command("crystals")(crystals_command)
    analyze_app.command("lobes")(lobes_command)
    analyze_app.command("galaxy")(galaxy_command)
    analyze_app.command("map")(map_command)


__all__ = ["register_analyze"]
