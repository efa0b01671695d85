"""The service layer of `labels`; its other layers: `sae_atlas.saes.labels` (engine).

Feature labels: the offline labels computed from the summaries and imported
explanations, stored per SAE (`store.feature_records`), searched with BM25 and joined onto
any table of features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.meaning import LabelHit
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.sae_view import SaeView, open_sae
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.explanations import read_explanations
from sae_atlas.saes.labels import auto_labels
from sae_atlas.store.feature_records import AUTO_LABELS, replace_auto_labels, update_labels
from sae_atlas.store.label_index import LabelIndex
from sae_atlas.store.locks import tables_lock
from sae_atlas.store.tables import FeatureTables

LABEL_COLUMNS = {"sae_id": pl.String, "latent": pl.Int64, "label": pl.String, "explanations": pl.List(pl.String)}


def with_labels(ctx: AtlasContext, frame: pl.DataFrame, views: dict[str, SaeView] | None = None) -> pl.DataFrame:
    """`frame` (with sae_id, latent) plus `label` (offline) and `explanations` (imported)
    columns, read for the rows asked for only. `views` are SAEs already opened by the caller."""
    views = views or {}
    wanted = frame.group_by("sae_id").agg("latent").iter_rows() if frame.height else []
    parts = [(views.get(sid) or open_sae(ctx, sid)).labels_by_latent().filter(pl.col("latent").is_in(latents))
             .with_columns(pl.lit(sid).alias("sae_id")) for sid, latents in wanted]
    table = (pl.concat([p.select(list(LABEL_COLUMNS)) for p in parts]) if parts
             else pl.DataFrame(schema=LABEL_COLUMNS))
    return frame.join(table, on=["sae_id", "latent"], how="left", maintain_order="left")


def labelled_token_features(ctx: AtlasContext, features: dict[str, list[list[dict[str, Any]]]],
                            views: dict[str, SaeView]) -> dict[str, list[list[dict[str, Any]]]]:
    """Per-token feature lists (SAE id -> per token -> `{latent, act}`) with each latent's
    offline label added."""
    pairs = pl.DataFrame([(sid, f["latent"]) for sid, per_token in features.items() for feats in per_token
                          for f in feats], schema={"sae_id": pl.String, "latent": pl.Int64}, orient="row").unique()
    labels = {(sid, latent): label for sid, latent, label in
              with_labels(ctx, pairs, views).select("sae_id", "latent", "label").iter_rows()}
    return {sid: [[{**f, "label": labels.get((sid, f["latent"]))} for f in feats] for feats in per_token]
            for sid, per_token in features.items()}


def search_labels(ctx: AtlasContext, query: str, views: list[SaeView], k: int) -> Rows[LabelHit]:
    """Features whose label or imported explanations match `query` (BM25, local): columns
    sae_id, latent, score, label, explanations."""
    labels = {view.sae_id: view.records("labels") for view in views}
    if not any(table.height for table in labels.values()):
        names = ", ".join(view.sae_id for view in views) or "any SAE"
        raise NotFoundError(f"no labels or explanations stored for {names}; build them with "
                            f"`sae-atlas search labels --atlas {ctx.root} --rebuild` (summarize does it) "
                            "or import explanations")
    versions = tuple(f"{view.sae_id}:{view.labels_version()}" for view in sorted(views, key=lambda v: v.sae_id))
    index = ctx.cache.current(("label-index", *sorted(labels)), versions,
                              lambda: LabelIndex(pl.concat(list(labels.values()))))
    hits = index.search(query, k)
    return Rows(LabelHit, with_labels(ctx, hits, {view.sae_id: view for view in views}).with_columns(
        pl.col("explanations").fill_null([])))


def build_labels(view: SaeView) -> int:
    """Compute the SAE's offline labels from its summary tables (`saes.labels`) and store
    them beside any imported explanations, holding the summary's exclusive lock from the
    read of the tables to the write, so the labels are those of the tables beside them;
    returns the number of labels."""
    with tables_lock(view.folder, "exclusive"):
        tables = FeatureTables(view.ctx.root, view.sae_id)
        labels = auto_labels(tables.features, tables.examples)
        replace_auto_labels(view.ctx.root, view.sae_id, labels)
    return labels.height


def import_explanations(view: SaeView, path: Path, source: str) -> int:
    """Store the explanations of `path` (`saes.explanations`) under `source`, replacing an
    earlier import of that source; returns how many were stored."""
    if not source or source == AUTO_LABELS:
        raise InvalidInputError(f"the source name must be non-empty and not {AUTO_LABELS!r}")
    new = read_explanations(path, view.d_sae).with_columns(
        pl.lit(view.sae_id).alias("sae_id"), pl.lit(source).alias("source"))
    update_labels(view.ctx.root, view.sae_id,
                  lambda kept: pl.concat([kept.filter(pl.col("source") != source), new.select(kept.columns)]))
    return new.height
