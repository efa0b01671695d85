"""The service layer of `meaning`; its other layers: `sae_atlas.api.http.routers.meaning` (HTTP),
`sae_atlas.api.results.meaning` (typed-result).

Searches by meaning over an atlas's SAEs: contrast two sets of texts, search for a
concept's features and span (both run the model through `saes.encoding`), and the
per-feature geometry records built from the stored analyses. The statistics are
`geometry` functions; this module composes them over the SAEs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.api.bounds import MAX_PROMPTS
from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.concept import ConceptSearchParams
from sae_atlas.api.operations.search import ContrastParams
from sae_atlas.api.results.meaning import (
    ConceptFeature,
    ConceptResult,
    ContrastFeature,
    ContrastResult,
    GeometryFeature,
)
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services.labels import with_labels
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.concept_search import search_concept
from sae_atlas.geometry.contrast import (
    benjamini_hochberg,
    contrast_stats,
    duplicate_groups,
    ranked,
)
from sae_atlas.saes.encoding.texts import pooled_feature_acts
from sae_atlas.saes.intervene.concept_codes import concept_feature_acts
from sae_atlas.saes.intervene.concepts import CategoryConcept, load_concept
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.feature_records import geometry_mask
from sae_atlas.store.geometry_records import rebuild_geometry_records

CONCEPT_KIND = "concept_search"
CONTRAST_COLUMNS = ["rank", "sae_id", "hook", "latent", "mean_a", "mean_b", "diff", "auroc", "effect_size",
                    "p_value", "q_value", "significant", "group"]
CONCEPT_COLUMNS = ["sae_id", "hook", "latent", "selective", "selectivity", "fire_rate", "mean_act", "value",
                   "span_order"]


def contrast(ctx: AtlasContext, views: list[SaeView], params: ContrastParams) -> ContrastResult:
    """Rank the features of `views` by how well they separate `texts_a` from `texts_b`
    (`geometry.contrast`), q-values over every tested feature of every SAE, the top `k`
    grouped into near-duplicates by decoder cosine, with their labels."""
    texts_a, texts_b, pool, alpha = params.texts_a, params.texts_b, params.pool, params.alpha
    n_permutations, duplicate_threshold = params.n_permutations, params.duplicate_threshold
    modules = {view.sae_id: view.module() for view in views}
    hooks = {view.sae_id: view.hook for view in views}
    handle = ctx.model()
    acts = ctx.run_locked(lambda: pooled_feature_acts(handle, modules, hooks, [*texts_a, *texts_b], pool=pool))
    n_a = len(texts_a)
    frames, n_tested = [], {}
    for sid, acts_NF in acts.items():
        stats = contrast_stats(acts_NF[:n_a], acts_NF[n_a:], n_permutations=n_permutations, seed=params.seed)
        n_tested[sid] = int(stats.tested_F.sum())
        frames.append(stats.frame.with_columns(pl.lit(sid).alias("sae_id"), pl.lit(hooks[sid]).alias("hook")))
    table = pl.concat(frames)
    table = table.with_columns(pl.Series("q_value", benjamini_hochberg(table["p_value"].to_numpy())))
    top = ranked(table, params.k, alpha=alpha)
    rows_KD = [modules[s].W_dec[i].detach().float().cpu().numpy()
               for s, i in zip(top["sae_id"], top["latent"], strict=True)]
    one_width = len({len(r) for r in rows_KD}) == 1
    groups = duplicate_groups(np.stack(rows_KD), duplicate_threshold) if one_width else np.arange(top.height)
    top = top.with_columns(pl.Series("group", groups, dtype=pl.Int64), (pl.col("q_value") <= alpha).alias("significant"))
    labelled = with_labels(ctx, top.select(CONTRAST_COLUMNS), {view.sae_id: view for view in views})
    return ContrastResult(
        n_a=n_a, n_b=len(texts_b), pool=pool, n_permutations=n_permutations, alpha=alpha,
        duplicate_threshold=duplicate_threshold, n_tested=n_tested,
        n_significant=int((table["q_value"] <= alpha).sum()), table=Rows(ContrastFeature, labelled.drop("explanations")),
    )


def concept_search(ctx: AtlasContext, views: list[SaeView], params: ConceptSearchParams) -> ConceptResult:
    """Concept features, greedy span and its fit in each SAE (`geometry.concept_search`);
    the best SAE is the one with the best held-out fit. `params.concept`: a built-in name, a
    dict or JSON file, or a concept object. `params.save` stores the result as analysis run
    `concept_search/<save>` and rebuilds the geometry records."""
    concept = params.concept
    if not hasattr(concept, "prompts"):
        concept = load_concept(concept, categories=True)
    options = {name: getattr(params, name) for name in ("min_fire_rate", "min_selectivity", "target",
                                                        "max_features", "seed")}
    kind = "categories" if isinstance(concept, CategoryConcept) else "ordered"
    n_prompts = len(concept.prompts())
    if n_prompts > MAX_PROMPTS:
        raise InvalidInputError(f"concept {concept.name!r} renders {n_prompts} prompts; the maximum is {MAX_PROMPTS}")
    modules = {view.sae_id: view.module() for view in views}
    hooks = {view.sae_id: view.hook for view in views}
    handle = ctx.model()
    acts = ctx.run_locked(lambda: concept_feature_acts(handle, modules, hooks, concept))
    per_sae, frames = {}, []
    for sid, sae in modules.items():
        fit = search_concept(acts.residual[hooks[sid]], acts.features[sid], acts.values_N,
                             sae.W_dec.detach().float().cpu().numpy(), kind, len(concept.values),
                             **options)
        per_sae[sid] = {"hook": hooks[sid], **fit.summary()}
        order = {latent: i for i, latent in enumerate(fit.span.latents)}
        frames.append(fit.features.with_columns(
            pl.lit(sid).alias("sae_id"), pl.lit(hooks[sid]).alias("hook"),
            pl.col("best_value").replace_strict(dict(enumerate(concept.values)), return_dtype=pl.String).alias("value"),
            pl.col("latent").replace_strict(order, default=None, return_dtype=pl.Int64).alias("span_order"),
        ))
    best = max(per_sae, key=lambda s: (_score(per_sae[s]), -len(per_sae[s]["span"])))
    features = pl.concat(frames).select(CONCEPT_COLUMNS).sort(["selective", "selectivity"], descending=[True, True])
    result = ConceptResult(concept=concept.to_dict(), kind=kind, per_sae=per_sae, best=best,
                           features=Rows(ConceptFeature, features))
    if params.save is not None:
        save_concept_run(ctx.root, params.save, result, {"saes": list(modules), **options})
        rebuild_geometry_records(ctx.root)
    labelled = with_labels(ctx, features, {view.sae_id: view for view in views}).drop("explanations")
    result.features = Rows(ConceptFeature, labelled)
    return result


def _score(summary: dict[str, Any]) -> float:
    return float("-inf") if summary["score"] is None else float(summary["score"])


def save_concept_run(root: Path, run: str, result: ConceptResult, parameters: dict[str, Any]) -> Path:
    """Store a concept search as analysis run `concept_search/<run>` (its feature table and,
    in the JSON, the parameters and per-SAE summaries); returns the JSON path."""
    return write_analysis(root, CONCEPT_KIND, run, parameters={"concept": result.concept, **parameters},
                          summary={"kind": result.kind, "best": result.best, "per_sae": result.per_sae},
                          tables={"main": result.features.frame})


def geometry_features(views: list[SaeView], *, in_circle: bool | None, period: float | None, lobe: int | None,
                      kind: str | None) -> Rows[GeometryFeature]:
    """The geometry records of the features of `views` that pass the geometry filters
    (`store.search.Filters` semantics), optionally of one kind."""
    frames = []
    for view in views:
        records = view.records("geometry")
        mask = geometry_mask(records, view.d_sae, in_circle=in_circle, period=period, lobe=lobe)
        selected = records.filter(pl.Series(mask[records["latent"].to_numpy()]))
        frames.append(selected if kind is None else selected.filter(pl.col("kind") == kind))
    return Rows(GeometryFeature, pl.concat(frames) if frames else pl.DataFrame())
