"""`sae-atlas analyze hierarchy|probe|crystals|lobes|galaxy|map`: hierarchical and linear
structure and feature maps (results under `analyses/<kind>/`, maps in `saes/<id>/`)."""

from __future__ import annotations

from pathlib import Path

import typer

from sae_atlas.api.commands.common import handle_errors, model_of_atlas, print_json, print_table
from sae_atlas.errors import InvalidInputError
from sae_atlas.store.layout import AtlasLayout


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


@handle_errors
def hierarchy_command(
    atlas: Path = typer.Option(None, help="Atlas directory to store the run in (optional without --sae)."),
    model: str = typer.Option("", help="Model spec (default: the atlas' model, else smollm2-135m)."),
    tree: str = typer.Option("curated", help="curated, wordnet, or a JSON tree file."),
    metric: str = typer.Option("causal", help="causal (whitened unembedding) or euclidean."),
    estimator: str = typer.Option("lda", help="Concept vector estimator: lda or mean."),
    min_tokens: int = typer.Option(5, min=2, help="Drop concepts with fewer single-token words."),
    sae: str = typer.Option("", help="Also test this SAE's features matched to the concepts."),
    match: str = typer.Option("decoder", help="Feature matching: decoder or activation."),
    seed: int = typer.Option(0, help="Seed of splits and controls."),
    run: str = typer.Option("", help="Run name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Parent-child orthogonality of concept vectors (Park et al. 2024), with controls."""
    from sae_atlas.api.analyses.hierarchy import run_feature_hierarchy, run_hierarchy

    handle = model_of_atlas(model, atlas)
    if sae:
        if atlas is None:
            raise InvalidInputError("--sae needs --atlas")
        report = run_feature_hierarchy(atlas, sae, handle.W_U, handle.tokenizer, tree=tree, match=match,
                                       metric=metric, min_tokens=min_tokens, seed=seed, run=run or None)
        rows = report.features.select("child", "parent", "child_latent", "parent_latent", "cos_child_parent",
                                      "cos_random_parent").rows()
        columns = ["child", "parent", "child latent", "parent latent", "cos(c-p, p)", "control"]
    else:
        report = run_hierarchy(handle.W_U, handle.tokenizer, tree=tree, metric=metric, estimator=estimator,
                               min_tokens=min_tokens, seed=seed, atlas=atlas, run=run or None)
        rows = report.result.edges.select("child", "parent", "n_child", "cos_child_parent", "cos_random_parent",
                                          "cos_shuffled").rows()
        columns = ["child", "parent", "tokens", "cos(c-p, p)", "random parent", "shuffled"]
    summary = report.result.summary if not sae else {"features": report.features.height}
    if as_json:
        print_json({"params": report.params, "summary": summary, "json_path": str(report.json_path)})
        return
    print_table(f"hierarchy ({metric}, {estimator})", columns, rows)
    print_table("summary", ["field", "value"], [(k, v) for k, v in summary.items()])


@handle_errors
def probe_command(
    atlas: Path = typer.Option(..., help="Atlas directory with cached activations."),
    hooks: str = typer.Option(..., help="Comma-separated cached hooks (one probe each)."),
    target: str = typer.Option("position", help="position (ridge) or a curated concept name, e.g. animal."),
    sae: str = typer.Option("", help="SAE id for k-sparse probes on neurons vs latents (concept targets)."),
    model: str = typer.Option("", help="Model whose tokenizer defines a concept's tokens."),
    max_tokens: int = typer.Option(20_000, min=10, help="Tokens per hook."),
    seed: int = typer.Option(0, help="Seed of the train/test split."),
    run: str = typer.Option("", help="Run name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Linear probes per layer on cached activations."""
    from sae_atlas.api.analyses.hierarchy import load_tree
    from sae_atlas.api.analyses.probes import run_probe
    from sae_atlas.api.analyses.run_files import encoder_of
    from sae_atlas.geometry.trees import tokenize_tree

    token_ids = None
    if target != "position":
        handle = model_of_atlas(model, atlas)
        tokenized = tokenize_tree(load_tree("curated"), encoder_of(handle.tokenizer), min_tokens=1)
        if target not in tokenized.token_ids:
            raise InvalidInputError(f"unknown concept {target!r}; valid: position, {', '.join(tokenized.token_ids)}")
        token_ids = tokenized.token_ids[target]
    out = run_probe(atlas, _csv(hooks), target=target, token_ids=token_ids, sae_id=sae or None,
                    max_tokens=max_tokens, seed=seed, run=run or None)
    if as_json:
        print_json({"params": out["params"], "tables": {k: v.to_dicts() for k, v in out["tables"].items()}})
        return
    for name, table in out["tables"].items():
        print_table(f"probe {target}: {name}", table.columns, table.rows())


@handle_errors
def crystals_command(
    model: str = typer.Option("", help="Model spec (default: the atlas' model, else smollm2-135m)."),
    atlas: Path = typer.Option(None, help="Atlas directory to store the run in."),
    hook: str = typer.Option("", help="Residual hook to read words at (default: input embeddings W_E)."),
    n_null: int = typer.Option(50, min=2, help="Random-label null draws."),
    seed: int = typer.Option(0, help="Seed of the split and null."),
    run: str = typer.Option("", help="Run name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Word-pair relation crystals: held-out LDA silhouette vs a random-label null."""
    from sae_atlas.api.analyses.crystals import run_crystals

    result, params = run_crystals(model_of_atlas(model, atlas), hook=hook or None, n_null=n_null, seed=seed,
                                  atlas=atlas, run=run or None)
    if as_json:
        print_json({"params": params, "summary": result.summary()})
        return
    print_table("crystals", ["field", "value"], list(result.summary().items()))


@handle_errors
def lobes_command(
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: str = typer.Option(..., help="SAE id (needs its feature summary's occurrence matrix)."),
    measure: str = typer.Option("jaccard", help="jaccard, dice, overlap or phi (clipped at 0)."),
    k: int = typer.Option(20, min=1, help="Co-occurrence neighbours kept per feature."),
    n_clusters: int = typer.Option(10, min=2, help="Number of lobes."),
    seed: int = typer.Option(0, help="Seed of spectral clustering and permutations."),
    run: str = typer.Option("", help="Run name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Co-occurrence lobes compared with geometric clusters by AMI."""
    from sae_atlas.api.analyses.lobes import run_lobes

    out = run_lobes(atlas, sae, measure=measure, k=k, n_clusters=n_clusters, seed=seed, run=run or None)
    if as_json:
        print_json({"params": out["params"], "comparison": out["comparison"], "json_path": str(out["json_path"])})
        return
    print_table(f"lobes of {sae}", ["field", "value"], list(out["comparison"].__dict__.items()))


@handle_errors
def galaxy_command(
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: str = typer.Option("", help="Comma-separated SAE ids (default: all)."),
    seed: int = typer.Option(0, help="Seed of the TwoNN subsample."),
    run: str = typer.Option("galaxy", help="Run name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Decoder covariance power-law slope (ranks 10-150) and TwoNN dimension per SAE."""
    from sae_atlas.api.analyses.galaxy import run_galaxy

    out = run_galaxy(atlas, _csv(sae) or None, seed=seed, run=run)
    if as_json:
        print_json({"params": out["params"], "table": out["table"].to_dicts()})
        return
    print_table("galaxy", out["table"].columns, out["table"].rows())


@handle_errors
def map_command(
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: str = typer.Option("", help="Comma-separated SAE ids (default: all)."),
    k_overlap: int = typer.Option(10, min=1, help="Neighbours checked by the kNN-overlap score."),
    n_neighbors: int = typer.Option(15, min=2, help="UMAP n_neighbors."),
    min_dist: float = typer.Option(0.1, help="UMAP min_dist."),
    seed: int = typer.Option(0, help="UMAP seed."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """UMAP maps of each SAE into saes/<id>/map.parquet, with kNN overlap: of the unit decoder
    rows, and of the activation co-occurrence graph once the SAE is summarized."""
    from sae_atlas.api.analyses.maps import run_map

    ids = _csv(sae) or AtlasLayout(atlas).sae_ids()
    if not ids:
        raise InvalidInputError(f"atlas {atlas} has no SAEs to map")
    results = {i: run_map(atlas, i, k_overlap=k_overlap, n_neighbors=n_neighbors, min_dist=min_dist, seed=seed)
               for i in ids}
    if as_json:
        print_json({i: {"summary": r["summary"], "path": str(r["path"])} for i, r in results.items()})
        return
    print_table("maps", ["sae", "features", "mean kNN overlap", "co-occurrence map's", "chance", "file"],
                [(i, r["summary"]["n_features"], r["summary"]["knn_overlap_mean"],
                  r["summary"].get("cooccurrence", {}).get("knn_overlap_mean", "not built"), r["summary"]["chance"],
                  str(r["path"])) for i, r in results.items()])


def register_analyze(analyze_app: typer.Typer) -> None:
    """Add hierarchy, probe, crystals, lobes, galaxy and map to the `analyze` sub-app."""
    analyze_app.command("hierarchy")(hierarchy_command)
    analyze_app.command("probe")(probe_command)
    analyze_app.command("crystals")(crystals_command)
    analyze_app.command("lobes")(lobes_command)
    analyze_app.command("galaxy")(galaxy_command)
    analyze_app.command("map")(map_command)


__all__ = ["register_analyze"]
