"""The service layer of `compare`; its other layers: `sae_atlas.api.commands.compare` (CLI),
`sae_atlas.api.http.routers.compare` (HTTP), `sae_atlas.api.operations.compare` (parameter),
`sae_atlas.api.results.compare` (typed-result).

Comparisons of two SAEs (`analyses/compare/<run>.*` in atlas A): run one
(`run_compare`, the model(s) streamed through `saes.compare`), list the stored ones and
read one back (read-only, every file verified).

A side is `ATLAS[:SAE]`: an atlas directory and one of its SAE ids (the atlas's only SAE
when left out). Both sides may name one atlas. A run stores the Hungarian pairs (`main`),
the rotation null's pair correlations (`null`), the space scores (`spaces`) and, with
`groups`, the per-group scores (`groups`); parameters name both atlases, SAEs, hooks and
models, the corpus and the scoring settings.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.api.context import AtlasContext, models_locked
from sae_atlas.api.operations.compare import STREAMED, CompareOptions
from sae_atlas.api.results.compare import (
    CompareResult,
    CompareRunRow,
    CorrelationHistogram,
    MatchedPair,
)
from sae_atlas.api.results.compare import Side as CompareSide
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.sae_view import SaeView, open_sae
from sae_atlas.api.services.analyses import run_states
from sae_atlas.api.services.labels import with_labels
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.atlas_saes import atlas_sae_output_width, hook_of
from sae_atlas.saes.compare.pairs import Side, paired_activations
from sae_atlas.saes.compare.saes_pair import (
    CompareParams,
    Comparison,
    check_shared_d_model,
    compare_codes,
    stream_statistics,
)
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext
from sae_atlas.store import analysis_runs
from sae_atlas.store.layout import AtlasLayout, check_id

KIND = "compare"


def parse_side(text: str) -> tuple[Path, str | None]:
    """`ATLAS[:SAE]` -> (atlas directory, SAE id or None); a path that exists as written is
    an atlas even if it holds a ':'."""
    if Path(text).is_dir() or ":" not in text:
        return Path(text), None
    root, _, sae_id = text.rpartition(":")
    return Path(root), sae_id or None


def side_sae(ctx: AtlasContext, sae_id: str | None) -> SaeView:
    """The SAE a side names (checked), or the atlas's only SAE."""
    if sae_id is not None:
        return open_sae(ctx, sae_id)
    ids = ctx.sae_ids()
    if len(ids) != 1:
        raise InvalidInputError(f"atlas {ctx.root} has {len(ids)} SAEs; name one as {ctx.root}:SAE "
                                f"({', '.join(ids) or 'none'})")
    return open_sae(ctx, ids[0])


def open_side(text: str, near: AtlasContext | None = None) -> SaeView:
    """`ATLAS[:SAE]` as given on a command line, as its SAE's view: its atlas opened once
    (through `near`, which keeps it, when given; `near` itself when it names that atlas)."""
    root, sae_id = parse_side(text)
    return side_sae(near.other(root) if near is not None else AtlasContext(root), sae_id)


def latent_groups(root: Path, spec: str) -> dict[str, np.ndarray]:
    """Groups of A's latents from a stored run `KIND/RUN[:COLUMN]` whose table has a `latent`
    column (e.g. `lobes/<run>`, grouped by `lobe`): group name -> latents."""
    ref, _, column = spec.partition(":")
    kind, _, run = ref.partition("/")
    table = analysis_runs.read_analysis(root, check_id(kind, "analysis kind"), check_id(run, "run name")).table
    if table is None or "latent" not in table.columns:
        raise InvalidInputError(f"analysis {ref} has no table with a 'latent' column to group latents by")
    column = column or next((c for c in table.columns if c != "latent"), "")
    if column not in table.columns:
        raise InvalidInputError(f"analysis {ref} has no column {column!r}; columns: {', '.join(table.columns)}")
    return {f"{column}={key}": part["latent"].to_numpy() for (key,), part in
            table.select("latent", column).drop_nulls().group_by(column, maintain_order=True)}


def _pairs_table(cmp: Comparison, W_a: np.ndarray, W_b: np.ndarray) -> pl.DataFrame:
    m = cmp.activation
    mutual = set(zip(m.mutual_a.tolist(), m.mutual_b.tolist(), strict=True))
    cos = None
    if W_a.shape[1] == W_b.shape[1]:
        ua = W_a[m.pairs_a] / np.linalg.norm(W_a[m.pairs_a], axis=1, keepdims=True).clip(1e-12)
        ub = W_b[m.pairs_b] / np.linalg.norm(W_b[m.pairs_b], axis=1, keepdims=True).clip(1e-12)
        cos = (ua * ub).sum(1)
    frame = pl.DataFrame({
        "a_latent": m.pairs_a.astype(np.int32), "b_latent": m.pairs_b.astype(np.int32), "corr": m.pair_similarity,
        "mutual": [(a, b) in mutual for a, b in zip(m.pairs_a.tolist(), m.pairs_b.tolist(), strict=True)],
        "decoder_cos": cos if cos is not None else pl.Series([None] * len(m.pairs_a), dtype=pl.Float64),
    })
    return frame.sort("corr", descending=True)


def _spaces_table(cmp: Comparison) -> pl.DataFrame:
    rows = []
    for key, s in cmp.spaces.items():
        space, score_name, null = key.split("_", 2)
        rows.append({"space": space, "score_name": score_name, "null": null, "score": s.score,
                     "null_mean": s.null_mean, "null_std": s.null_std, "p_value": s.p_value, "n_null": s.n_null})
    return pl.DataFrame(rows)


def default_run(sae_a: str, root_b: Path, sae_b: str, same_atlas: bool) -> str:
    """`<sae_a>--<sae_b>`, with B's atlas folder name when the atlases differ."""
    b = sae_b if same_atlas else f"{root_b.resolve().name}.{sae_b}"
    return check_id(f"{sae_a}--{b}"[:128], "run name")


def compare_atlases(a: SaeView, b: SaeView, options: CompareOptions, *, corpus: CorpusSpec | None = None,
                    device: str = "cpu") -> CompareResult:
    """`run_compare` on one process."""
    result = run_compare(a, b, options, corpus=corpus or CorpusSpec(), device=device, progress=False)
    assert result is not None  # one process is rank 0
    return result


def run_compare(a: SaeView, b: SaeView, options: CompareOptions, *, corpus: CorpusSpec, device: str = "cpu",
                dist: DistContext | None = None, progress: bool = True) -> CompareResult | None:
    """Compare SAE `a` with SAE `b` (of this atlas or another, each over its atlas's context:
    its model, lock and caches) over `options.n_tokens` tokens of `corpus` on `device` and
    store the run in A's atlas; the stored result (None on a torchrun rank other than 0,
    which streams its share)."""
    params = CompareParams(**options.model_dump(include=set(STREAMED)))
    decoder, groups, run = options.decoder, options.groups, options.run
    ctx_a, ctx_b = a.ctx, b.ctx
    same_atlas = ctx_a.root.resolve() == ctx_b.root.resolve()
    if same_atlas and a.sae_id == b.sae_id:
        raise InvalidInputError(f"both sides name SAE {a.sae_id!r} of {ctx_a.root}; compare two different SAEs")
    run = check_id(run, "run name") if run else default_run(a.sae_id, ctx_b.root, b.sae_id, same_atlas)
    group_map = latent_groups(ctx_a.root, groups) if groups else None
    width_a = atlas_sae_output_width(ctx_a.root, a.sae_id)
    width_b = atlas_sae_output_width(ctx_b.root, b.sae_id)
    if decoder and width_a is not None and width_b is not None:
        check_shared_d_model(width_a, width_b)  # from the stored configs, before any model or SAE is loaded
    where = dist.device(device) if dist else device
    sae_a, sae_b = a.module(str(where)), b.module(str(where))
    handles = [ctx_a.model(str(where)), ctx_b.model(str(where))]
    side_a, side_b = Side(handles[0], hook_of(sae_a, a.sae_id)), Side(handles[1], hook_of(sae_b, b.sae_id))
    with models_locked(ctx_a, ctx_b):
        stats = stream_statistics(sae_a, sae_b, paired_activations(side_a, side_b, corpus, n_tokens=params.n_tokens,
                                                                    batch_blocks=params.batch_blocks, ctx=dist,
                                                                    progress=progress), params, dist)
    if dist is not None and not dist.is_main:
        return None
    W_a, W_b = (s.W_dec.detach().float().cpu().numpy() for s in (sae_a, sae_b))
    cmp = compare_codes(stats, W_a, W_b, params, decoder=decoder, groups=group_map)
    tables = {"main": _pairs_table(cmp, W_a, W_b), "spaces": _spaces_table(cmp),
              "null": pl.DataFrame({"corr": cmp.rotation_pair_corr})}
    if cmp.groups:
        tables["groups"] = pl.DataFrame(cmp.groups)
    parameters = {
        "atlas_a": str(ctx_a.root.resolve()), "sae_a": a.sae_id, "hook_a": side_a.hook, "model_a": handles[0].name,
        "atlas_b": str(ctx_b.root.resolve()), "sae_b": b.sae_id, "hook_b": side_b.hook, "model_b": handles[1].name,
        "shared_tokenizer": handles[0].tokenizer.get_vocab() == handles[1].tokenizer.get_vocab(),
        "corpus": asdict(corpus), "decoder": decoder, "groups": groups, **asdict(params),
        "world_size": dist.world_size if dist else 1,
    }
    analysis_runs.write_analysis(ctx_a.root, KIND, run, parameters=parameters, summary=cmp.summary(), tables=tables)
    return compare_result(ctx_a, run)


def correlation_histogram(pairs_corr: np.ndarray, null_corr: np.ndarray, bins: int = 40) -> CorrelationHistogram:
    """Counts of the pairs' and the rotation null's correlations on shared bins from the lowest
    value (at most 0) to 1."""
    both = np.concatenate([pairs_corr, null_corr]).astype(np.float64)
    both = both[np.isfinite(both)]
    lo = min(0.0, float(np.floor(both.min() * 10) / 10)) if both.size else 0.0
    edges = np.linspace(max(lo, -1.0), 1.0, bins + 1)

    def count(values: np.ndarray) -> list[int]:
        return np.histogram(np.clip(values[np.isfinite(values)], edges[0], 1.0), edges)[0].tolist()

    return CorrelationHistogram(edges=edges.round(6).tolist(), pairs=count(pairs_corr), null=count(null_corr))


def compare_result(ctx: AtlasContext, run: str) -> CompareResult:
    """A stored comparison of atlas `ctx`, every file verified (NotFoundError lists the
    stored runs), its pairs labelled (`labelled_pairs`)."""
    stored = analysis_runs.read_analysis(ctx.root, KIND, check_id(run, "run name"))
    empty = pl.DataFrame({"corr": []}, schema={"corr": pl.Float64})
    pairs = stored.tables.get("main", empty)
    histogram = correlation_histogram(pairs["corr"].to_numpy(), stored.tables.get("null", empty)["corr"].to_numpy())
    summary, parameters = stored.meta.get("summary", {}), stored.meta.get("parameters", {})
    if "a_latent" in pairs.columns:
        pairs = labelled_pairs(ctx, run, parameters, pairs)
    return CompareResult(run, parameters, summary, Rows(MatchedPair, pairs),
                         stored.tables.get("spaces", pl.DataFrame()).to_dicts(),
                         stored.tables.get("groups", pl.DataFrame()).to_dicts(), histogram, p_value_notes(summary))


def side_context(ctx: AtlasContext, run: str, parameters: dict[str, Any], side: CompareSide
                 ) -> tuple[AtlasContext, str]:
    """The opened atlas and SAE id of one side of comparison `run` (of atlas `ctx`, with its
    stored `parameters`): side B's atlas, when another, opened once and kept for the life of
    `ctx` (NotFoundError naming the recorded path when it is gone)."""
    sae_id = str(parameters.get(f"sae_{side}", ""))
    where = Path(str(parameters.get("atlas_b", "")))
    if side == "a" or where.resolve() == ctx.root.resolve():
        return ctx, sae_id
    if not AtlasLayout(where).atlas_json.exists():
        raise NotFoundError(f"B's atlas {where} (recorded by comparison {run!r}) is gone: no atlas.json there")
    return ctx.other(where), sae_id


def labelled_pairs(ctx: AtlasContext, run: str, parameters: dict[str, Any], pairs: pl.DataFrame) -> pl.DataFrame:
    """`pairs` (a_latent, b_latent, ...) with each side's offline label, `a_label` and
    `b_label`, read from that side's atlas; null where a latent has none, or where its side's
    atlas or SAE is gone (its feature card names what is missing)."""
    columns = []
    for side in ("a", "b"):
        latents = pairs.select(pl.col(f"{side}_latent").cast(pl.Int64).alias("latent"))
        try:
            where, sae_id = side_context(ctx, run, parameters, side)
            labels = with_labels(where, latents.with_columns(pl.lit(sae_id).alias("sae_id")))["label"]
        except NotFoundError:
            labels = pl.Series([None] * pairs.height, dtype=pl.String)
        columns.append(labels.alias(f"{side}_label"))
    return pairs.with_columns(columns)


def p_value_notes(summary: dict[str, Any], level: float = 0.05) -> list[str]:
    """For each score whose null had too few draws for a p-value below `level` (with n
    draws the smallest is 1/(1+n)): why, and the option that buys more draws."""
    scores = [("MCC (activation)", summary.get("mcc_null"), "--rotations"),
              ("MCC (decoder cosine)", summary.get("decoder_mcc_null"), "--rotations"),
              *((key.replace("_", " "), null, "--n-perm") for key, null in summary.get("spaces", {}).items())]
    notes = []
    for name, null, option in scores:
        if null and 1 / (1 + null["n_null"]) >= level:
            need = math.floor(1 / level)  # the fewest draws whose 1/(1+n) is below `level`
            cost = (" (each rotation streams B once more and runs one more matching of every latent pair)"
                    if option == "--rotations" else "")
            notes.append(f"{name}: p = {null['p_value']:.2g} is the smallest p-value {null['n_null']} null draw(s) "
                         f"allow, 1/(1+n); rerun with {option} {need} or more for p < {level}{cost}")
    return notes


def compare_runs(root: str | Path) -> list[CompareRunRow]:
    """Every stored comparison of the atlas with its headline scores and its status, as
    `api.services.analyses.run_states` gives it: a damaged run names the bad file and the
    repair, one that `runs.json` does not list the command that registers it again."""
    rows = []
    for state in run_states(Path(root), KIND):
        p, s = (state.meta or {}).get("parameters", {}), (state.meta or {}).get("summary", {})
        rows.append(CompareRunRow(run=state.run, sae_a=p.get("sae_a", ""), atlas_b=p.get("atlas_b", ""),
                                  sae_b=p.get("sae_b", ""), n_tokens=int(s.get("n_tokens", 0)), mcc=s.get("mcc"),
                                  mcc_null=(s.get("mcc_null") or {}).get("null_mean"),
                                  decoder_mcc=s.get("decoder_mcc"), status=state.status,
                                  problem=None if state.problem is None else state.problem.describe(root)))
    return rows


def summary_rows(result: CompareResult) -> list[tuple[str, Any, Any, Any]]:
    """`(score, value, null mean, p-value)` rows of a comparison, for a table."""
    s = result.summary
    rows = [("MCC (activation)", s["mcc"], s["mcc_null"]["null_mean"], s["mcc_null"]["p_value"]),
            ("mean max corr A->B", s["mean_max_a"], None, None), ("mean max corr B->A", s["mean_max_b"], None, None),
            ("mutual nearest pairs", s["n_mutual"], None, None),
            ("rare latents left out (A / B)", f"{s['n_rare_a']} / {s['n_rare_b']}", None, None)]
    if s.get("decoder_mcc_null"):
        d = s["decoder_mcc_null"]
        rows.append(("MCC (decoder cosine)", d["score"], d["null_mean"], d["p_value"]))
    for key, d in s["spaces"].items():
        rows.append((key.replace("_", " "), d["score"], d["null_mean"], d["p_value"]))
    return rows
