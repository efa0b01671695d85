"""Reading stored crosscoders (`sae-atlas train-crosscoder` writes them): the listing, a
filtered page of one crosscoder's latents with its relative-norm histogram, and one
latent's card with the atlas features nearest to each side of its decoder row.

The relative norm and the classes are those of Lindsey et al. 2024 ("Sparse crosscoders for
cross-layer features and model diffing"); further per-latent columns of the table (Latent
Scaling's `beta_*` / `nu_*`, Minder et al. 2025) are passed along under `scaling`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from sae_atlas.api.bounds import MAX_INDEX, check_int
from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.compare import Side
from sae_atlas.api.results.crosscoder import (
    CrosscoderLatentCard,
    CrosscoderLatentRow,
    CrosscoderLatents,
    CrosscoderRow,
    NearFeature,
    RelativeNormHistogram,
)
from sae_atlas.api.sae_view import SaeView, open_sae
from sae_atlas.api.services import search
from sae_atlas.api.services.crosscoder import KIND, crosscoder_dir
from sae_atlas.errors import AtlasError, InvalidInputError, NotFoundError
from sae_atlas.saes.compare.crosscoder import (
    A_ONLY_BELOW,
    B_ONLY_ABOVE,
    CROSSCODER_FILE,
    LatentClass,
    read_crosscoder_sides,
)
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.store import analysis_runs
from sae_atlas.store.atomic import file_version
from sae_atlas.store.layout import check_id
from sae_atlas.store.search import Filters

BASE_COLUMNS = ("latent", "norm_a", "norm_b", "relative_norm", "latent_class")
CLASSES: tuple[LatentClass, ...] = ("a_only", "shared", "b_only")
HISTOGRAM_BINS = 50  # width 0.02: the class bounds 0.1 and 0.9 fall on bin edges


def crosscoder_ids(ctx: AtlasContext) -> list[str]:
    """Ids of the stored crosscoders (their `analyses/crosscoder` runs)."""
    return analysis_runs.list_runs(ctx.root, KIND)


def _stored(ctx: AtlasContext, cc_id: str) -> analysis_runs.AnalysisRun:
    """The verified run of crosscoder `cc_id`, read again when it was rewritten (NotFoundError
    naming the stored ids)."""
    check_id(cc_id, "crosscoder id")
    ids = crosscoder_ids(ctx)
    if cc_id not in ids:
        raise NotFoundError(f"no crosscoder {cc_id!r}; stored crosscoders: {', '.join(ids) or '(none)'} "
                            "(train one with `sae-atlas train-crosscoder`)")
    _, js = analysis_runs.run_paths(ctx.root, KIND, cc_id)
    return ctx.cache.current(("crosscoder-run", cc_id), file_version(js),
                             lambda: analysis_runs.read_analysis(ctx.root, KIND, cc_id))


def _row(cc_id: str, meta: dict[str, Any]) -> CrosscoderRow:
    p, s = meta.get("parameters", {}), meta.get("summary", {})
    return CrosscoderRow(crosscoder=cc_id, model_a=str(p.get("model_a", "")), hook_a=str(p.get("hook_a", "")),
                         model_b=str(p.get("model_b", "")), hook_b=str(p.get("hook_b", "")),
                         d_sae=int(p.get("d_sae", 0)), k=int(p.get("k", 0)), n_tokens=int(p.get("n_tokens", 0)),
                         **{c: int(s.get(c, 0)) for c in CLASSES})


def crosscoders(ctx: AtlasContext) -> list[CrosscoderRow]:
    """Every stored crosscoder with its sides and class counts (each run verified)."""
    return [_row(cc_id, _stored(ctx, cc_id).meta) for cc_id in crosscoder_ids(ctx)]


def _table(run: analysis_runs.AnalysisRun) -> pl.DataFrame:
    table = run.table
    if table is None or not set(BASE_COLUMNS) <= set(table.columns):
        raise InvalidInputError(f"crosscoder run {run.run!r} has no table with columns {', '.join(BASE_COLUMNS)}")
    return table


def scaling_columns(table: pl.DataFrame) -> list[str]:
    """The table's numeric columns past the base ones (Latent Scaling's, when it has them)."""
    return [c for c, dtype in table.schema.items() if c not in BASE_COLUMNS and dtype.is_numeric()]


def latent_row(record: dict[str, Any], scaling: list[str]) -> CrosscoderLatentRow:
    """A table row: the base columns, and the `scaling` columns under `scaling`."""
    return CrosscoderLatentRow(latent=int(record["latent"]), norm_a=record["norm_a"], norm_b=record["norm_b"],
                               relative_norm=record["relative_norm"], latent_class=record["latent_class"],
                               scaling={k: record[k] for k in scaling})


def histogram(table: pl.DataFrame) -> RelativeNormHistogram:
    """Counts of latents per relative-norm bin of width 1/HISTOGRAM_BINS, one list per class."""
    edges = np.linspace(0.0, 1.0, HISTOGRAM_BINS + 1)
    counts = {c: np.histogram(table.filter(pl.col("latent_class") == c)["relative_norm"].to_numpy(), edges)[0]
              for c in CLASSES}
    return RelativeNormHistogram(edges=edges.round(6).tolist(), **{c: v.tolist() for c, v in counts.items()},
                                 a_only_below=A_ONLY_BELOW, b_only_above=B_ONLY_ABOVE)


def crosscoder_latents(ctx: AtlasContext, cc_id: str, *, latent_class: LatentClass | None = None,
                       sort: str = "relative_norm", descending: bool = True, offset: int = 0,
                       limit: int = 100) -> CrosscoderLatents:
    """The latents of `latent_class` (all when None) sorted by the column `sort`, `limit` of
    them from `offset`, beside the relative-norm histogram of every latent."""
    run = _stored(ctx, cc_id)
    table = _table(run)
    sortable = [c for c, dtype in table.schema.items() if dtype.is_numeric()]
    if sort not in sortable:
        raise NotFoundError(f"crosscoder {cc_id!r} has no numeric column {sort!r} to sort by; columns: "
                            f"{', '.join(sortable)}")
    chosen = table if latent_class is None else table.filter(pl.col("latent_class") == latent_class)
    page = chosen.sort(sort, descending=descending, nulls_last=True).slice(offset, limit)
    return CrosscoderLatents(crosscoder=_row(cc_id, run.meta), latent_class=latent_class, sort=sort,
                             descending=descending, total=chosen.height, offset=offset,
                             rows=[latent_row(r, scaling_columns(table)) for r in page.iter_rows(named=True)],
                             histogram=histogram(table))


def _decoder(ctx: AtlasContext, cc_id: str) -> tuple[np.ndarray, int]:
    """The crosscoder's decoder rows `[F, d_a + d_b]` and `d_a` (kept per crosscoder.json version)."""
    folder = crosscoder_dir(ctx.root, cc_id)

    def load() -> tuple[np.ndarray, int]:
        if not (folder / CROSSCODER_FILE).exists():
            raise NotFoundError(f"crosscoder {cc_id!r} has no weights folder {folder} (its {CROSSCODER_FILE} is "
                                "missing); train it again with `sae-atlas train-crosscoder`")
        d_a = int(read_crosscoder_sides(folder)["d_a"])
        return load_saelens(folder).W_dec.detach().float().cpu().numpy(), d_a

    return ctx.cache.current(("crosscoder-decoder", cc_id), file_version(folder / CROSSCODER_FILE), load)


def _saes_at(ctx: AtlasContext, hook: str, d_in: int) -> list[SaeView]:
    """The atlas's indexed SAEs (not transcoders) reading `hook` with width `d_in`; damaged
    ones left out."""
    views = []
    for sae_id in ctx.sae_ids():
        try:
            view = open_sae(ctx, sae_id)
            if view.hook == hook and view.hook_out is None and view.d_in == d_in and view.has_index:
                views.append(view)
        except AtlasError:
            continue
    return views


def nearest_features(ctx: AtlasContext, direction_D: np.ndarray, hook: str, k: int) -> list[NearFeature] | None:
    """The `k` features of the atlas's SAEs at `hook` whose decoder rows have the largest cosine
    with `direction_D` (the atlas's vector search), with their labels; None when no indexed SAE
    of that width reads `hook`."""
    views = _saes_at(ctx, hook, direction_D.shape[0])
    if not views:
        return None
    labelled = search.by_vector(ctx, direction_D, views, k, Filters())
    return [NearFeature(sae_id=r["sae_id"], latent=r["latent"], cosine=r["cosine"], label=r["label"])
            for r in labelled]


def crosscoder_latent(ctx: AtlasContext, cc_id: str, latent: int, *, k: int = 5) -> CrosscoderLatentCard:
    """One latent's card: both decoder norms, the relative norm and class, any Latent Scaling
    values, and per side the `k` nearest features among this atlas's SAEs at that side's hook
    (side B only when it reads this atlas's model)."""
    run = _stored(ctx, cc_id)
    table, row = _table(run), _row(cc_id, run.meta)
    latent = check_int(latent, "latent", 0, MAX_INDEX)
    found = table.filter(pl.col("latent") == latent)
    if not found.height:
        raise NotFoundError(f"latent {latent} out of range for crosscoder {cc_id!r}: valid 0..{table.height - 1}")
    record = latent_row(found.row(0, named=True), scaling_columns(table))
    W_dec, d_a = _decoder(ctx, cc_id)
    rows: dict[Side, np.ndarray] = {"a": W_dec[latent, :d_a], "b": W_dec[latent, d_a:]}
    hooks: dict[Side, str] = {"a": row["hook_a"], "b": row["hook_b"]}
    same_model = run.meta.get("parameters", {}).get("spec_b") is None or row["model_b"] == row["model_a"]
    nearest: dict[Side, list[NearFeature] | None] = {"a": None, "b": None}
    notes = []
    for side in ("a", "b"):
        if side == "b" and not same_model:
            notes.append(f"side B reads another model ({row['model_b']}); this atlas's SAEs read {row['model_a']}")
            continue
        nearest[side] = nearest_features(ctx, rows[side], hooks[side], k)
        if nearest[side] is None:
            notes.append(f"no indexed SAE of this atlas reads {hooks[side]} with d_model {rows[side].shape[0]} "
                         f"(side {side.upper()}; `sae-atlas index` builds the indexes)")
    return CrosscoderLatentCard(crosscoder=row, latent=latent, norm_a=record["norm_a"], norm_b=record["norm_b"],
                                relative_norm=record["relative_norm"], latent_class=record["latent_class"],
                                scaling=record["scaling"], nearest_a=nearest["a"], nearest_b=nearest["b"], notes=notes)
