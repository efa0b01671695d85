"""Meaning searches for the Atlas facade: contrast two sets of texts and search for a
concept's features and span. The model runs through `saes` (`saes.text_features`,
`saes.intervene.concepts`), the statistics are `geometry` functions; this module only
composes them over the atlas's SAEs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from api.atlas_sources import ResourceCache
from api.results.meaning import ConceptResult, ContrastResult
from geometry.concept_search import search_concept
from geometry.contrast import (
    MAX_PERMUTATIONS,
    benjamini_hochberg,
    contrast_stats,
    duplicate_groups,
    ranked,
)
from geometry.feature_geometry import rebuild_geometry_records
from geometry.results import write_analysis
from saes.concept_features import concept_feature_acts
from saes.explanations import read_explanations
from saes.intervene.concepts import CategoryConcept, OrderedConcept, load_concept
from saes.labels import auto_labels
from saes.models import ModelHandle
from saes.text_features import POOLS, Pool, pooled_feature_acts
from store.errors import InvalidInputError
from store.feature_records import (
    RecordTable,
    geometry_mask,
    read_records,
    record_paths,
    write_records,
)
from store.label_index import LabelIndex

__all__ = ["Pool", "check_texts", "concept_search", "contrast", "load_concept", "save_concept_run"]
MAX_TEXTS = 1000
MAX_SPAN = 32
MAX_PROMPTS = 4096
CONCEPT_KIND = "concept_search"


def check_texts(texts: Sequence[str], what: str, max_chars: int) -> list[str]:
    """`texts` as a list if it is 2..MAX_TEXTS non-empty strings of at most `max_chars`."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidInputError(f"{what} must be a list of strings")
    texts = list(texts)
    if not 2 <= len(texts) <= MAX_TEXTS:
        raise InvalidInputError(f"{what} must hold 2..{MAX_TEXTS} texts, got {len(texts)}")
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise InvalidInputError(f"{what}: every text must be a non-empty string")
        if len(t) > max_chars:
            raise InvalidInputError(f"{what}: a text has {len(t)} characters; the maximum is {max_chars}")
    return texts


def contrast(
    handle: ModelHandle,
    saes: dict[str, Any],
    hooks: dict[str, str],
    texts_a: list[str],
    texts_b: list[str],
    *,
    k: int,
    pool: Pool,
    n_permutations: int,
    alpha: float,
    duplicate_threshold: float,
    seed: int,
    run_locked: Callable[[Callable[[], Any]], Any],
) -> ContrastResult:
    """Rank the features of `saes` by how well they separate `texts_a` from `texts_b`
    (`geometry.contrast`), q-values over every tested feature of every SAE, the top `k`
    grouped into near-duplicates by decoder cosine."""
    if not 0 < alpha < 1:
        raise InvalidInputError(f"alpha must be in (0, 1), got {alpha}")
    if not 1 <= n_permutations <= MAX_PERMUTATIONS:  # checked before the model runs
        raise InvalidInputError(f"n_permutations must be in 1..{MAX_PERMUTATIONS}, got {n_permutations}")
    if pool not in POOLS:
        raise InvalidInputError(f"unknown pooling {pool!r}; valid: {', '.join(POOLS)}")
    acts = run_locked(lambda: pooled_feature_acts(handle, saes, hooks, [*texts_a, *texts_b], pool=pool))
    n_a = len(texts_a)
    frames, n_tested = [], {}
    for sid, acts_NF in acts.items():
        stats = contrast_stats(acts_NF[:n_a], acts_NF[n_a:], n_permutations=n_permutations, seed=seed)
        n_tested[sid] = int(stats.tested_F.sum())
        frames.append(stats.frame().with_columns(pl.lit(sid).alias("sae_id"), pl.lit(hooks[sid]).alias("hook")))
    table = pl.concat(frames)
    table = table.with_columns(pl.Series("q_value", benjamini_hochberg(table["p_value"].to_numpy())))
    top = ranked(table, k, alpha=alpha)
    rows_KD = [saes[s].W_dec[i].detach().float().cpu().numpy() for s, i in zip(top["sae_id"], top["latent"], strict=True)]
    one_width = len({len(r) for r in rows_KD}) == 1
    groups = duplicate_groups(np.stack(rows_KD), duplicate_threshold) if one_width else np.arange(top.height)
    top = top.with_columns(pl.Series("group", groups, dtype=pl.Int64), (pl.col("q_value") <= alpha).alias("significant"))
    columns = ["rank", "sae_id", "hook", "latent", "mean_a", "mean_b", "diff", "auroc", "effect_size",
               "p_value", "q_value", "significant", "group"]
    return ContrastResult(
        n_a=n_a, n_b=len(texts_b), pool=pool, n_permutations=n_permutations, alpha=alpha,
        duplicate_threshold=duplicate_threshold, n_tested=n_tested,
        n_significant=int((table["q_value"] <= alpha).sum()), table=top.select(columns),
    )


def concept_search(
    handle: ModelHandle,
    saes: dict[str, Any],
    hooks: dict[str, str],
    concept: OrderedConcept | CategoryConcept,
    *,
    min_fire_rate: float,
    min_selectivity: float,
    target: float,
    max_features: int,
    seed: int,
    run_locked: Callable[[Callable[[], Any]], Any],
) -> ConceptResult:
    """Concept features, greedy span and its fit in each of `saes` (`geometry.concept_search`);
    the best SAE is the one with the best held-out fit."""
    for name, value in (("min_fire_rate", min_fire_rate), ("min_selectivity", min_selectivity), ("target", target)):
        if not 0 < value <= 1:
            raise InvalidInputError(f"{name} must be in (0, 1], got {value}")
    if not 1 <= max_features <= MAX_SPAN:
        raise InvalidInputError(f"max_features must be in 1..{MAX_SPAN}, got {max_features}")
    kind = "categories" if isinstance(concept, CategoryConcept) else "ordered"
    n_prompts = len(concept.prompts())
    if n_prompts > MAX_PROMPTS:
        raise InvalidInputError(f"concept {concept.name!r} renders {n_prompts} prompts; the maximum is {MAX_PROMPTS}")
    acts = run_locked(lambda: concept_feature_acts(handle, saes, hooks, concept))
    per_sae, frames = {}, []
    for sid, sae in saes.items():
        fit = search_concept(acts.residual[hooks[sid]], acts.features[sid], acts.values_N,
                             sae.W_dec.detach().float().cpu().numpy(), kind, len(concept.values),
                             min_fire_rate=min_fire_rate, min_selectivity=min_selectivity, target=target,
                             max_features=max_features, seed=seed)
        per_sae[sid] = {"hook": hooks[sid], **fit.summary()}
        order = {latent: i for i, latent in enumerate(fit.span.latents)}
        frames.append(fit.features.with_columns(
            pl.lit(sid).alias("sae_id"), pl.lit(hooks[sid]).alias("hook"),
            pl.col("best_value").replace_strict(dict(enumerate(concept.values)), return_dtype=pl.String).alias("value"),
            pl.col("latent").replace_strict(order, default=None, return_dtype=pl.Int64).alias("span_order"),
        ))
    best = max(per_sae, key=lambda s: (_score(per_sae[s]), -len(per_sae[s]["span"])))
    columns = ["sae_id", "hook", "latent", "selective", "selectivity", "fire_rate", "mean_act", "value", "span_order"]
    features = pl.concat(frames).select(columns).sort(["selective", "selectivity"], descending=[True, True])
    return ConceptResult(concept=concept.to_dict(), kind=kind, per_sae=per_sae, best=best, features=features)


def _score(summary: dict[str, Any]) -> float:
    return float("-inf") if summary["score"] is None else float(summary["score"])


def save_concept_run(root: Path, run: str, result: ConceptResult, parameters: dict[str, Any]) -> Path:
    """Store a concept search as analysis run `concept_search/<run>` (its feature table and,
    in the JSON, the parameters and per-SAE summaries); returns the JSON path."""
    return write_analysis(root, CONCEPT_KIND, run, parameters={"concept": result.concept, **parameters},
                          summary={"kind": result.kind, "best": result.best, "per_sae": result.per_sae},
                          tables={"main": result.features})


def feature_records(cache: ResourceCache, root: Path, sae_id: str, table: RecordTable) -> pl.DataFrame:
    """An SAE's record table (`geometry` or `labels`), read once per version of its sidecar."""
    return cache.get(("records", sae_id, table, _version(root, sae_id, table)), lambda: read_records(root, sae_id, table))


def rebuild_geometry(root: Path) -> dict[str, int]:
    """Rewrite every SAE's geometry records from the stored analyses; rows per SAE."""
    return rebuild_geometry_records(root)


def select_geometry(records: pl.DataFrame, n_latents: int, *, in_circle: bool | None, period: float | None,
                    lobe: int | None, kind: str | None) -> pl.DataFrame:
    """The records of the features that pass the geometry filters (`store.search.Filters`
    semantics), optionally of one kind."""
    mask = geometry_mask(records, n_latents, in_circle=in_circle, period=period, lobe=lobe)
    selected = records.filter(pl.Series(mask[records["latent"].to_numpy()]))
    return selected if kind is None else selected.filter(pl.col("kind") == kind)


AUTO = "auto"


def build_labels(root: Path, sae_id: str, tables: Any) -> int:
    """Compute the SAE's offline labels from its summary tables (`saes.labels`) and store
    them beside any imported explanations; returns the number of labels."""
    auto = auto_labels(tables.features, tables.examples).with_columns(
        pl.lit(sae_id).alias("sae_id"), pl.lit(AUTO).alias("source"))
    kept = read_records(root, sae_id, "labels").filter(pl.col("source") != AUTO)
    write_records(root, sae_id, "labels", pl.concat([auto.select(kept.columns), kept]))
    return auto.height


def import_explanations(root: Path, sae_id: str, path: Path, source: str, d_sae: int) -> int:
    """Store the explanations of `path` (`saes.explanations`) under `source`, replacing an
    earlier import of that source; returns how many were stored."""
    if not source or source == AUTO:
        raise InvalidInputError(f"the source name must be non-empty and not {AUTO!r}")
    new = read_explanations(path, d_sae).with_columns(pl.lit(sae_id).alias("sae_id"), pl.lit(source).alias("source"))
    kept = read_records(root, sae_id, "labels").filter(pl.col("source") != source)
    write_records(root, sae_id, "labels", pl.concat([kept, new.select(kept.columns)]))
    return new.height


def label_index(cache: ResourceCache, root: Path, labels: dict[str, pl.DataFrame]) -> LabelIndex:
    """The BM25 index over the given SAEs' labels (built once per version of them)."""
    versions = tuple(f"{sid}:{_version(root, sid, 'labels')}" for sid in sorted(labels))
    return cache.get(("label-index", *versions), lambda: LabelIndex(pl.concat(list(labels.values()))))


def _version(root: Path, sae_id: str, table: RecordTable) -> str:
    """A record table's version: its sidecar's modification time (written last)."""
    sidecar = record_paths(root, sae_id, table)[1]
    return str(sidecar.stat().st_mtime_ns) if sidecar.exists() else "none"


def labels_by_latent(cache: ResourceCache, root: Path, sae_id: str) -> pl.DataFrame:
    """One row per labelled latent of an SAE's labels table: latent, label (the offline
    one), explanations (imported texts); computed once per version of the table."""
    key = ("labels-by-latent", sae_id, _version(root, sae_id, "labels"))
    return cache.get(key, lambda: _labels_by_latent(feature_records(cache, root, sae_id, "labels")))


def _labels_by_latent(labels: pl.DataFrame) -> pl.DataFrame:
    auto = labels.filter(pl.col("source") == AUTO).select("latent", pl.col("text").alias("label"))
    imported = (labels.filter(pl.col("source") != AUTO).group_by("latent")
                .agg(pl.col("text").sort().alias("explanations")))
    return auto.join(imported, on="latent", how="full", coalesce=True).with_columns(
        pl.col("latent").cast(pl.Int64), pl.col("explanations").cast(pl.List(pl.String)))
