"""The geometry analyses run over one atlas (`api.analyses.*`): hierarchy, probes,
crystals, lobes, galaxy and feature maps, each from its parameter object
(`api.operations.analyses`), each returning what it stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sae_atlas.api.analyses.galaxy import run_galaxy
from sae_atlas.api.analyses.hierarchy import load_tree, run_feature_hierarchy, run_hierarchy
from sae_atlas.api.analyses.lobes import run_lobes
from sae_atlas.api.analyses.maps import run_map
from sae_atlas.api.analyses.run_files import encoder_of
from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.analyses import (
    CrystalsParams,
    GalaxyParams,
    HierarchyParams,
    LobesParams,
    MapBuildParams,
    ProbeParams,
)
from sae_atlas.api.results.analysis import AnalysisResult
from sae_atlas.api.results.geometry_builds import MapBuild
from sae_atlas.api.services.analyses import analysis
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.geometry.trees import tokenize_tree
from sae_atlas.saes.models import ModelHandle


def _unstored(kind: str, parameters: dict[str, Any], summary: dict[str, Any], table: Any) -> AnalysisResult:
    """A result run without an atlas to store it in (no run name, no figures)."""
    return AnalysisResult(kind=kind, run="", meta={"parameters": parameters, "summary": summary}, table=table,
                          figures=[])


def hierarchy(handle: ModelHandle, params: HierarchyParams, root: Path | None) -> AnalysisResult:
    """Writes (with `root`): parent-child orthogonality of the concept vectors of `handle`'s
    unembedding, or with `params.sae_id` of that SAE's matched features (needs `root`)."""
    p = params
    if p.sae_id is not None:
        if root is None:
            raise InvalidInputError("matching an SAE's features (sae_id) needs an atlas")
        report = run_feature_hierarchy(root, p.sae_id, handle.W_U, handle.tokenizer, tree=p.tree, match=p.match,
                                       metric=p.metric, min_tokens=p.min_tokens, seed=p.seed, run=p.run)
    else:
        report = run_hierarchy(handle.W_U, handle.tokenizer, tree=p.tree, metric=p.metric, estimator=p.estimator,
                               min_tokens=p.min_tokens, seed=p.seed, atlas=root, run=p.run)
    if root is None or report.json_path is None:
        return _unstored("hierarchy", report.params, report.result.summary, report.result.edges)
    return analysis(root, report.json_path.parent.name, report.json_path.stem)


def probe(ctx: AtlasContext, params: ProbeParams) -> AnalysisResult:
    """Writes: linear probes per cached hook of the position, or of a curated concept (its
    tokens in the tokenizer of `params.model`, default the atlas's)."""
    from sae_atlas.api.analyses.probes import run_probe  # sklearn: loaded when a probe runs

    token_ids = None
    if params.target != "position":
        handle = ctx.model_of(params.model) if params.model else ctx.model()
        tokenized = tokenize_tree(load_tree("curated"), encoder_of(handle.tokenizer), min_tokens=1)
        if params.target not in tokenized.token_ids:
            raise InvalidInputError(f"unknown concept {params.target!r}; valid: position, "
                                    f"{', '.join(tokenized.token_ids)}")
        token_ids = tokenized.token_ids[params.target]
    out = run_probe(ctx.root, params.hooks, target=params.target, token_ids=token_ids, sae_id=params.sae_id,
                    max_tokens=params.max_tokens, seed=params.seed, run=params.run)
    return analysis(ctx.root, "probe", out["json_path"].stem)


def crystals(handle: ModelHandle, params: CrystalsParams, root: Path | None) -> AnalysisResult:
    """Writes (with `root`): the crystal quality of the built-in word-pair relations on
    `handle`'s embeddings (or the residual at `params.hook`)."""
    from sae_atlas.api.analyses.crystals import run_crystals  # sklearn: loaded when crystals run

    result, stored = run_crystals(handle, hook=params.hook, n_null=params.n_null, seed=params.seed, atlas=root,
                                  run=params.run)
    if root is None:
        return _unstored("crystals", stored, result.summary(), None)
    return analysis(root, "crystals", Path(stored["json_path"]).stem)


def lobes(ctx: AtlasContext, params: LobesParams) -> AnalysisResult:
    """Writes: co-occurrence lobes of SAE `params.sae_id` against its geometric clusters."""
    ctx.layout.require_sae(params.sae_id)
    out = run_lobes(ctx.root, params.sae_id, measure=params.measure, k=params.k, n_clusters=params.n_clusters,
                    seed=params.seed, run=params.run)
    return analysis(ctx.root, "lobes", out["json_path"].stem)


def galaxy(ctx: AtlasContext, params: GalaxyParams) -> AnalysisResult:
    """Writes: the decoder spectrum slope and TwoNN dimension of each SAE (default all)."""
    run_galaxy(ctx.root, params.saes, seed=params.seed, run=params.run)
    return analysis(ctx.root, "galaxy", params.run)


def build_maps(ctx: AtlasContext, params: MapBuildParams) -> list[MapBuild]:
    """Writes: the UMAP maps of each SAE (default all) into `saes/<id>/map.parquet`."""
    ids = params.saes or ctx.sae_ids()
    if not ids:
        raise NotFoundError(f"atlas {ctx.root} has no SAEs to map")
    for sae_id in ids:
        ctx.layout.require_sae(sae_id)
    built = []
    for sae_id in ids:
        out = run_map(ctx.root, sae_id, k_overlap=params.k_overlap, n_neighbors=params.n_neighbors,
                      min_dist=params.min_dist, seed=params.seed)
        built.append(MapBuild(sae_id, out["summary"], out["path"]))
    return built
