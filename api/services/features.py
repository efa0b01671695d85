"""The service layer of `features`; its other layers: `sae_atlas.api.http.routers.features` (HTTP).

Feature pages and the per-latent tables of one SAE."""

from __future__ import annotations

from typing import Any

import polars as pl

from sae_atlas.api.results.feature import Feature, StoredExample
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services.depth_runs import feature_depth
from sae_atlas.api.services.labels import with_labels
from sae_atlas.api.services.search import cross_layer_card
from sae_atlas.store.hooks import hook_layer
from sae_atlas.store.search import Match, matches_frame
from sae_atlas.store.tables import FeatureTables, histogram_edges

STAT_KEYS = ("n_active", "density", "mean_act", "mean_active_act", "max_act", "decoder_norm")


def feature_page(view: SaeView, latent: int, *, examples: int, neighbours: int) -> Feature:
    """Everything about one feature: stats, histogram, top examples, logit effects,
    nearest decoder neighbours in its SAE, best cross-layer matches, map position, the
    geometry results it belongs to, where it fires in depth terms and its labels."""
    latent = view.latent(latent)
    tables = view.tables()
    row = tables.feature(latent)
    stats: dict[str, Any] = {key: row[key] for key in STAT_KEYS}
    stats["quantiles"] = dict(zip(map(str, tables.params.get("quantile_levels", [])), row["quantiles"] or [],
                                  strict=False))
    similar = cross_layer = damaged_saes = None
    if view.has_index:
        similar = _labelled_rows(view, view.ctx.search().similar(view.sae_id, latent, neighbours))
        matches, damaged_saes = cross_layer_card(view, latent, min(neighbours, 5))
        cross_layer = _labelled_rows(view, matches)
    labels = with_labels(view.ctx, pl.DataFrame({"sae_id": [view.sae_id], "latent": [latent]}), {view.sae_id: view})
    return Feature(
        sae_id=view.sae_id,
        index=latent,
        hook=view.hook,
        hook_out=view.hook_out,
        stats=stats,
        histogram=histogram(tables, row),
        examples=tables.examples_for(latent, "top").head(examples)
        .select("act", "block", "pos", "centre", "tokens", "acts").to_dicts(),
        top_logits=_logits(row, "top"),
        bottom_logits=_logits(row, "bottom"),
        neighbours=similar,
        cross_layer=cross_layer,
        map_position=view.map_position(latent),
        damaged_saes=damaged_saes,
        geometry=view.records("geometry").filter(pl.col("latent") == latent).drop("sae_id").to_dicts(),
        depth=feature_depth(view.ctx, view.sae_id, latent, hook_layer(view.hook)),
        **labels.select("label", "explanations").row(0, named=True),
    )


def table_page(view: SaeView, *, offset: int, limit: int, sort: str) -> tuple[int, pl.DataFrame]:
    """The number of latents and rows `offset` to `offset + limit` of the SAE's per-latent
    table sorted by `sort` (largest first, except `latent`), each row with its label."""
    frame = view.tables().features.select("latent", "n_active", "density", "mean_act", "mean_active_act", "max_act")
    if sort != "latent":
        frame = frame.sort(sort, descending=True)
    page = frame.slice(offset, limit).with_columns(pl.col("latent").cast(pl.Int64), pl.lit(view.sae_id).alias("sae_id"))
    return frame.height, with_labels(view.ctx, page, {view.sae_id: view}).drop("sae_id", "explanations")


def _labelled_rows(view: SaeView, matches: list[Match]) -> list[dict[str, Any]]:
    """Matches as rows with each latent's label and imported explanations."""
    return with_labels(view.ctx, matches_frame(matches), {view.sae_id: view}).to_dicts()


def histogram(tables: FeatureTables, row: dict[str, Any]) -> dict[str, list[float]]:
    """A latent's activation histogram: bin `edges` (len n+2, first 0) and `counts` (n+1)."""
    counts = list(row["hist_counts"])
    edges = histogram_edges(float(row["hist_top"]), len(counts) - 1, int(tables.params.get("bins_per_octave", 8)))
    return {"edges": [0.0, *edges.tolist()], "counts": counts}


def _logits(row: dict[str, Any], side: str) -> list[dict[str, Any]]:
    ids, values = row[f"{side}_logit_ids"] or [], row[f"{side}_logit_values"] or []
    tokens = row[f"{side}_logit_tokens"] or [None] * len(ids)
    return [{"token_id": i, "token": t, "value": v} for i, t, v in zip(ids, tokens, values, strict=False)]


def examples(view: SaeView, latent: int, kind: str | None) -> Rows[StoredExample]:
    """All stored example contexts of a feature (top-k and activation bands)."""
    return Rows(StoredExample, view.tables().examples_for(view.latent(latent), kind))
