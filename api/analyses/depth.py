"""The analysis-run layer of `depth`; its other layers: `sae_atlas.api.http.routers.depth` (HTTP),
`sae_atlas.api.operations.depth` (parameter), `sae_atlas.api.results.depth` (typed-result),
`sae_atlas.api.services.depth` (service).

The depth analysis (`analyses/depth/<run>.*`): how the residual stream moves through the
layers, from one streamed forward (`saes.depth.capture`), with the estimators of `geometry`.

Tables: `main` (per layer: TwoNN and MLE dimension with its bootstrap interval, local
dimension quantiles, trajectory step/curvature/cosine means into the layer, logit- and
tuned-lens agreement, KL and true-token rank, the tuned lens's fitting loss), `cka` (every
layer pair), `tokens` (the subsampled tokens' trajectory summaries, for finding extremes)
and `lid_docs` (mean local dimension per document and layer); with stored SAEs, `features`
(per feature: the local ID at its layer and the trajectory of the tokens it fires on, each
beside every token's). The summary names the ID
peak layer, the first layer where each lens agrees with the final top-1 above 50%, and the
tokens with extreme trajectories. Figures: the profile (ID and local ID with intervals, lens
agreement and KL against depth), the CKA heat map, and a few tokens in each layer's top-2 PCs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from matplotlib.figure import Figure

from sae_atlas.api.analyses.run_files import run_figure
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.depth_shift import depth_shift_table
from sae_atlas.geometry.feature_depth import feature_depth_table
from sae_atlas.geometry.figures_depth import (
    cka_figure,
    depth_profile_figure,
    shift_figure,
    trajectory_figure,
)
from sae_atlas.geometry.intrinsic_dimension import local_dimension, mle_dimension, twonn_dimension
from sae_atlas.geometry.trajectories import TrajectorySpace, trajectory_geometry
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.depth.capture import DepthStream, clear_state, state_folder, stream_depth
from sae_atlas.saes.depth.families import family_depth, read_families
from sae_atlas.saes.depth.pair import stream_pair
from sae_atlas.saes.distributed import DistContext, rank_and_world
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.encoding.tokens import piece_text
from sae_atlas.saes.models import ModelHandle
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.hooks import hook_layer

KIND = "depth"
STATE_DIR = "depth-stream"  # under the atlas: checkpoints of unfinished streams (see saes.depth.capture)


def _first_above(rows: list[dict[str, Any]], column: str, threshold: float = 0.5) -> int | None:
    return next((r["layer"] for r in rows if r.get(column) is not None and r[column] > threshold), None)


def _with_text(frame: pl.DataFrame, stream: DepthStream, tokenizer: Any | None) -> pl.DataFrame:
    """Extreme-token rows (`row` = index into the stream) with, given the tokenizer, the
    token's `text` and the `context` of the block's tokens ending at it; `row` dropped."""
    if tokenizer is None:
        return frame.drop("row")
    rows = frame["row"].to_list()
    return frame.drop("row").with_columns(
        pl.Series("text", [piece_text(tokenizer, int(stream.token[i])) for i in rows]),
        pl.Series("context", [tokenizer.decode([int(t) for t in stream.context[i] if t >= 0]) for i in rows]))


def depth_tables(stream: DepthStream, *, k: int, mle_k: int, n_boot: int, seed: int, space: TrajectorySpace,
                 feature_codes: dict[str, tuple[int, np.ndarray]] | None = None, tokenizer: Any | None = None,
                 ) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """The run's tables and summary from a streamed pass (see the module docstring);
    `feature_codes` (`{sae_id: (layer, codes [M, F] of the subsampled tokens)}`) adds the
    `features` table: per feature, the local ID and trajectory of the tokens it fires on;
    `tokenizer` adds each extreme token's `text` and `context` (its block's last tokens up
    to it) to the summary."""
    M = len(stream.states)
    if M <= k:
        raise InvalidInputError(f"local dimension with k={k} needs more than {k} tokens; the stream kept {M} "
                                f"(of {stream.n_tokens} seen): give more tokens (--tokens) or lower --k")
    traj = trajectory_geometry(stream.states, space=space)
    lens = {(r["lens"], r["layer"]): r for r in stream.lens.table()}
    rows, lid_docs, lid_by_layer = [], [], {}
    for i, layer in enumerate(stream.layers):
        X = stream.states[:, i]
        two, mle, lid = twonn_dimension(X, n_boot=n_boot, seed=seed), mle_dimension(X, k=mle_k, n_boot=n_boot, seed=seed), \
            local_dimension(X, k=k)
        lid_by_layer[layer] = lid
        row: dict[str, Any] = {
            "layer": layer, "twonn": two.dimension, "twonn_low": two.low, "twonn_high": two.high,
            "mle": mle.dimension, "mle_low": mle.low, "mle_high": mle.high,
            "lid_mean": float(lid.mean()), **{f"lid_q{q}": float(np.quantile(lid, q / 100)) for q in (10, 50, 90)},
            "step_length": float(traj.step_length[:, i - 1].mean()) if i else None,
            "curvature": float(np.nanmean(traj.curvature[:, i - 2])) if i >= 2 else None,
            "consecutive_cosine": float(traj.consecutive_cosine[:, i - 1].mean()) if i else None,
            "cosine_to_final": float(traj.cosine_to_final[:, i].mean()),
            "tuned_fit_loss": stream.tuned.fit_loss[layer],
        }
        for kind in ("logit", "tuned"):
            r = lens[kind, layer]
            row |= {f"{kind}_top1": r["top1_agreement"], f"{kind}_kl": r["kl"], f"{kind}_median_rank": r["median_rank"]}
        rows.append(row)
        docs = pl.DataFrame({"doc": stream.doc, "lid": lid}).group_by("doc").agg(
            pl.col("lid").mean().alias("lid_mean"), pl.len().alias("n_tokens"))
        lid_docs.append(docs.with_columns(pl.lit(layer).alias("layer")))
    cka = stream.cka.result()
    cka_rows = [{"layer_a": a, "layer_b": b, "cka": float(cka[i, j])}
                for i, a in enumerate(stream.layers) for j, b in enumerate(stream.layers)]
    tokens = pl.DataFrame({
        "block": stream.block, "position": stream.position, "doc": stream.doc, "token": stream.token,
        "convergence_index": traj.convergence_index, "mean_curvature": np.nanmean(traj.curvature, axis=1),
        "path_length": traj.step_length.sum(axis=1)})
    peak = max(rows, key=lambda r: r["twonn"])["layer"]
    located = ["block", "position", "token"]
    indexed = tokens.with_row_index("row")
    extremes = {"lowest_convergence": indexed.sort("convergence_index").head(5).select("row", *located,
                                                                                       "convergence_index"),
                "highest_curvature": indexed.sort("mean_curvature", descending=True, nulls_last=True).head(5)
                .select("row", *located, "mean_curvature")}
    extremes = {name: _with_text(frame, stream, tokenizer) for name, frame in extremes.items()}
    summary = {"layers": stream.layers, "n_tokens": stream.n_tokens, "n_subsampled": M, "id_peak_layer": peak,
               "logit_lens_first_layer_top1_above_half": _first_above(rows, "logit_top1"),
               "tuned_lens_first_layer_top1_above_half": _first_above(rows, "tuned_top1"),
               "tuned_lens_fit_tokens": stream.tuned.n_fit,
               "extreme_tokens": {name: frame.to_dicts() for name, frame in extremes.items()}}
    tables = {"main": pl.DataFrame(rows), "cka": pl.DataFrame(cka_rows), "tokens": tokens,
              "lid_docs": pl.concat(lid_docs).sort(["layer", "doc"])}
    if feature_codes:
        curvature = tokens["mean_curvature"].to_numpy()
        tables["features"] = pl.concat([
            feature_depth_table(codes, {"lid": lid_by_layer[layer], "convergence_index": traj.convergence_index,
                                        "curvature": curvature}).select(pl.lit(sae_id).alias("sae_id"), pl.all())
            for sae_id, (layer, codes) in feature_codes.items()])
    return tables, summary


def _load_saes(atlas: str | Path, sae_ids: list[str], layers: list[int]) -> dict[str, tuple[int, Any]]:
    """`{sae_id: (layer, SAE)}`, each SAE checked to read the residual stream after a streamed layer."""
    out = {}
    for sae_id in sae_ids:
        sae = load_atlas_sae(atlas, sae_id, device="cpu")
        hook = sae.cfg.hook_name
        if not hook.endswith("hook_resid_post") or hook_layer(hook) not in layers:
            raise InvalidInputError(f"SAE {sae_id} reads {hook}; the depth run streams hook_resid_post of layers "
                                    f"{sorted(set(layers))}")
        out[sae_id] = (hook_layer(hook), sae)
    return out


def _feature_codes(sae: Any, layer: int, stream: DepthStream) -> np.ndarray:
    """Codes `[M, F]` of `sae` on the subsampled tokens' states at `layer`."""
    with torch.inference_mode():
        return sae_codes(sae, torch.from_numpy(stream.states[:, stream.layers.index(layer)])).float().cpu().numpy()


def _trajectory_plot(stream: DepthStream, tokens: pl.DataFrame, handle: ModelHandle) -> Figure:
    """A few tokens (the fastest and slowest to converge, the most curved) across layers."""
    order = np.argsort(tokens["convergence_index"].to_numpy())
    curved = int(np.nanargmax(tokens["mean_curvature"].fill_nan(None).fill_null(-1.0).to_numpy()))
    picked = np.array(list(dict.fromkeys([int(order[0]), int(order[1]), int(order[-1]), int(order[-2]), curved])))
    labels = [f"{piece_text(handle.tokenizer, int(stream.token[i]))!r} (block {stream.block[i]}, pos {stream.position[i]})"
              for i in picked]
    return trajectory_figure(stream.states, stream.layers, picked, labels)


def run_depth(
    atlas: str | Path, handle: ModelHandle, corpus: CorpusSpec, layers: list[int] | None = None, *,
    n_tokens: int = 16384, batch_blocks: int = 8, max_points: int = 4000, k: int = 20, mle_k: int = 10,
    n_boot: int = 200, fit_fraction: float = 0.25, space: TrajectorySpace = "raw", seed: int = 0,
    run: str = "depth", progress: bool = True, ctx: DistContext | None = None, sae_ids: list[str] | None = None,
    checkpoint_every: int | None = None,
) -> dict[str, Any] | None:
    """Stream the model once over `n_tokens` of `corpus` at every layer of `layers` (default:
    all), compute the per-layer depth profile and store it as `analyses/depth/<run>`. Under
    torchrun (`ctx`) the ranks split the batches and rank 0 writes (the others return None).
    `sae_ids`: stored SAEs of the atlas (on a residual stream of the streamed layers) whose
    features get the local ID and trajectory of the tokens they fire on (table `features`).
    The stream checkpoints under `<atlas>/depth-stream/` (every `checkpoint_every` batches,
    by default every minute): after kill -9 the same call resumes there."""
    chosen = list(range(handle.n_layers)) if layers is None else layers
    saes = _load_saes(atlas, sae_ids or [], chosen)
    state = state_folder(Path(atlas) / STATE_DIR, handle, {
        "corpus": corpus, "layers": sorted(set(chosen)), "n_tokens": n_tokens, "batch_blocks": batch_blocks,
        "max_points": max_points, "fit_fraction": fit_fraction, "seed": seed, "world": rank_and_world(ctx)[1]})
    stream = stream_depth(handle, corpus, chosen, n_tokens=n_tokens, batch_blocks=batch_blocks,
                          max_points=max_points, fit_fraction=fit_fraction, seed=seed, progress=progress, ctx=ctx,
                          state=state, checkpoint_every=checkpoint_every)
    if ctx is not None and not ctx.is_main:
        return None
    codes = {sae_id: (layer, _feature_codes(sae, layer, stream)) for sae_id, (layer, sae) in saes.items()}
    tables, summary = depth_tables(stream, k=k, mle_k=mle_k, n_boot=n_boot, seed=seed, space=space,
                                   feature_codes=codes, tokenizer=handle.tokenizer)
    figures = [run_figure(depth_profile_figure(tables["main"], f"depth profile of {handle.name}"), atlas, KIND, run,
                          "profile"),
               run_figure(cka_figure(stream.layers, stream.cka.result()), atlas, KIND, run, "cka"),
               run_figure(_trajectory_plot(stream, tables["tokens"], handle), atlas, KIND, run, "trajectories")]
    params = {"model": handle.name, "layers": stream.layers, "corpus": corpus.source,
              "context_size": corpus.context_size, "n_tokens": n_tokens, "batch_blocks": batch_blocks,
              "max_points": max_points, "k": k, "mle_k": mle_k, "n_boot": n_boot, "fit_fraction": fit_fraction,
              "space": space, "seed": seed, "tuned_lens": "ridge least squares to the final residual",
              "ranks": 1 if ctx is None else ctx.world_size, "sae_ids": list(sae_ids or [])}
    js = write_analysis(atlas, KIND, run, parameters=params, summary=summary, tables=tables,
                        extra={"figures": figures})
    clear_state(state)
    return {"tables": tables, "summary": summary, "params": params, "json_path": js}


def run_depth_families(
    atlas: str | Path, handle: ModelHandle, families_file: str | Path, layers: list[int] | None = None, *,
    k: int = 10, space: TrajectorySpace = "raw", n_permutations: int = 2000, seed: int = 0,
    run: str = "depth-families",
) -> dict[str, Any]:
    """Depth metrics per prompt family of `families_file` and their pairwise permutation
    tests (`saes.depth.families`), stored as `analyses/depth/<run>` (main table: the
    per-family means; `prompts` and `tests` beside it)."""
    families = read_families(families_file)
    chosen = list(range(handle.n_layers)) if layers is None else layers
    tables = family_depth(handle, families, chosen, k=k, space=space, n_permutations=n_permutations, seed=seed)
    tests = tables["tests"]
    summary = {"families": {name: len(prompts) for name, prompts in families.items()},
               "smallest_p": tests.sort("p_value").head(5).to_dicts()}
    params = {"model": handle.name, "layers": sorted(set(chosen)), "families_file": str(families_file), "k": k,
              "space": space, "n_permutations": n_permutations, "seed": seed}
    js = write_analysis(atlas, KIND, run, parameters=params, summary=summary,
                        tables={"main": tables["families"], "prompts": tables["prompts"], "tests": tests})
    return {"tables": tables, "summary": summary, "params": params, "json_path": js}


def run_depth_pair(
    atlas: str | Path, handle: ModelHandle, other: ModelHandle, corpus: CorpusSpec, layers: list[int] | None = None,
    other_layers: list[int] | None = None, *, n_tokens: int = 16384, batch_blocks: int = 8, max_points: int = 4000,
    k: int = 20, mle_k: int = 10, n_boot: int = 200, n_permutations: int = 1000, seed: int = 0,
    run: str = "depth-pair", progress: bool = True,
) -> dict[str, Any]:
    """Model `handle` (A) against `other` (B) on the same tokens of `corpus`
    (`saes.depth.pair`), stored as `analyses/depth/<run>` of `atlas`: table `main` (CKA of
    every layer of A against every layer of B) and, when both read the same layer numbers,
    `shift` = the per-layer ID and LID of both models and their shift with its null
    (`geometry.depth_shift`; base vs fine-tuned). `other_layers` defaults to `layers` when B
    has them all, else to every layer of B."""
    chosen = list(range(handle.n_layers)) if layers is None else layers
    if other_layers is None:
        other_layers = chosen if max(chosen) < other.n_layers else list(range(other.n_layers))
    stream = stream_pair(handle, other, corpus, chosen, other_layers, n_tokens=n_tokens, batch_blocks=batch_blocks,
                         max_points=max_points, seed=seed, progress=progress)
    if len(stream.states_a) <= max(k, mle_k):
        raise InvalidInputError(f"local dimension with k={max(k, mle_k)} needs more than {max(k, mle_k)} paired "
                                f"tokens; the stream kept {len(stream.states_a)}: give more tokens or lower --k")
    cross = stream.cross_cka()
    tables = {"main": pl.DataFrame([{"layer_a": a, "layer_b": b, "cka": float(cross[i, j])}
                                   for i, a in enumerate(stream.layers_a) for j, b in enumerate(stream.layers_b)])}
    summary: dict[str, Any] = {
        "n_tokens": stream.n_tokens, "n_subsampled": len(stream.states_a), "layers_a": stream.layers_a,
        "layers_b": stream.layers_b,
        "best_b_layer": {str(a): stream.layers_b[int(np.nanargmax(cross[i]))] for i, a in enumerate(stream.layers_a)}}
    figures = [run_figure(cka_figure(stream.layers_a, cross, layers_b=stream.layers_b,
                                     title=f"CKA: {handle.name} (rows) vs {other.name}"), atlas, KIND, run, "cka")]
    if stream.layers_a == stream.layers_b:
        main = depth_shift_table(stream.states_a, stream.states_b, stream.layers_a, k=k, mle_k=mle_k, n_boot=n_boot,
                                 n_permutations=n_permutations, seed=seed)
        tables["shift"] = main
        moved = main.filter((pl.col("mle_shift_p") < 0.05) | (pl.col("lid_shift_p") < 0.05))
        summary |= {"shift_layers_p_below_0_05": moved["layer"].to_list(),
                    "largest_mle_shift": main.sort(pl.col("mle_shift").abs(), descending=True).head(1)
                    .select("layer", "mle_a", "mle_b", "mle_shift", "mle_shift_p").to_dicts()[0]}
        figures.append(run_figure(shift_figure(main, f"{other.name} minus {handle.name}"), atlas, KIND, run, "shift"))
    else:
        summary["shift"] = "not computed: the two models are read at different layers"
    params = {"model": handle.name, "model_b": other.name, "layers": stream.layers_a, "layers_b": stream.layers_b,
              "corpus": corpus.source, "context_size": corpus.context_size, "n_tokens": n_tokens,
              "batch_blocks": batch_blocks, "max_points": max_points, "k": k, "mle_k": mle_k, "n_boot": n_boot,
              "n_permutations": n_permutations, "seed": seed,
              "aligned_by": "shared token ids" if handle.tokenizer.get_vocab() == other.tokenizer.get_vocab()
              else "character spans (tokens ending at the same character)"}
    js = write_analysis(atlas, KIND, run, parameters=params, summary=summary, tables=tables,
                        extra={"figures": figures})
    return {"tables": tables, "summary": summary, "params": params, "json_path": js}
