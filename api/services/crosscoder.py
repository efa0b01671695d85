"""The service layer of `crosscoder`; its other layers: `sae_atlas.api.operations.crosscoder`
(parameter), `sae_atlas.api.results.crosscoder` (typed-result),
`sae_atlas.saes.compare.crosscoder` (engine).

Training a crosscoder on two models (or two hooks of one model) streamed at the same
tokens, stored in atlas A: the weights in `crosscoders/<id>/` (SAELens layout + its
`crosscoder.json`, resumable after a kill) and each latent's relative decoder norm as the
analysis run `analyses/crosscoder/<id>`; Latent Scaling of its latents
(`saes.compare.latent_scaling`) adds columns to that run's table."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.crosscoder import CrosscoderParams, LatentScalingParams
from sae_atlas.api.results.analysis import CrosscoderRun
from sae_atlas.api.services.analyses import analysis_as, analysis_run
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.crosscoder import (
    SideScales,
    crosscoder_dir,
    default_crosscoder_id,
    paired_batches,
    read_crosscoder_sides,
    relative_norms,
    train_crosscoder,
)
from sae_atlas.saes.compare.latent_scaling import LatentScaling, latent_scaling, own_sides
from sae_atlas.saes.compare.pairs import Side, paired_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.models import normalize_spec
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.layout import check_id

KIND = "crosscoder"
SCALING_COLUMNS = ("beta_error_a", "beta_error_b", "beta_recon_a", "beta_recon_b", "nu_error", "nu_recon",
                   "scaling_active_tokens")


def model_b_spec(model_b: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Model B's spec as recorded: JSON parsed, a local folder or file made absolute (so a
    later `latent-scaling` from another directory finds it)."""
    spec = normalize_spec(model_b) if model_b else None
    if isinstance(spec, str) and Path(spec).expanduser().exists():
        return str(Path(spec).expanduser().resolve())
    return spec


def _sides(ctx: AtlasContext, hook_a: str, hook_b: str, model_b: str | dict[str, Any] | None,
           device: str) -> tuple[Side, Side]:
    """Side A (the atlas's model at `hook_a`) and side B (`model_b`, default the same model),
    both loaded through the atlas's context."""
    if ctx.model_override is None and ctx.meta.get("model") is None:
        raise InvalidInputError(f"{ctx.layout.atlas_json} records no model; a crosscoder needs the atlas's model")
    handle_a = ctx.model(device)
    handle_b = ctx.model_of(model_b, device) if model_b else handle_a
    if handle_a is handle_b and hook_a == hook_b:
        raise InvalidInputError(f"both sides read {hook_a!r} of one model; name two hooks or a second model")
    return Side(handle_a, handle_a.check_hook(hook_a)), Side(handle_b, handle_b.check_hook(hook_b))


def _rows(a: Side, b: Side, corpus: CorpusSpec, n_tokens: int, batch_blocks: int) -> Iterator[torch.Tensor]:
    """Paired rows `[N, d_a + d_b]` (float32, cpu) over about `n_tokens` corpus tokens."""
    return (torch.cat([p.a_ND.float().cpu(), p.b_ND.float().cpu()], dim=1)
            for p in paired_activations(a, b, corpus, n_tokens=n_tokens, batch_blocks=batch_blocks, progress=False))


def _check_scalable(a: Side, b: Side) -> None:
    if a.handle.d_model != b.handle.d_model:
        raise InvalidInputError(f"Latent Scaling needs both sides in one space; d_model is {a.handle.d_model} for A "
                                f"and {b.handle.d_model} for B")


def _scaling(ctx: AtlasContext, sae: SAE, scales: SideScales, a: Side, b: Side, corpus: CorpusSpec, n_tokens: int,
             batch_blocks: int, table: pl.DataFrame) -> tuple[LatentScaling, dict[str, Any], dict[str, Any]]:
    """Latent Scaling of every latent (its own side the one with the larger decoder norm)
    over `n_tokens` tokens (holding the atlas's model lock), with the parameters and the
    summary it adds to the run."""
    _check_scalable(a, b)
    latents = table["latent"].to_numpy()
    batches = (scales.apply(rows) for rows in _rows(a, b, corpus, n_tokens, batch_blocks))
    with ctx.model_lock:
        result = latent_scaling(sae, scales.d_a, batches, latents, own_sides(table["relative_norm"].to_numpy()))
    params = {"n_tokens": n_tokens, "corpus": corpus.__dict__, "batch_blocks": batch_blocks}
    b_only = table["latent_class"].to_numpy() == "b_only"
    fired = b_only & (result.active_tokens > 0)
    summary = {"median_nu_error_b_only": float(np.median(result.nu_error[fired])) if fired.any() else None,
               "median_nu_recon_b_only": float(np.median(result.nu_recon[fired])) if fired.any() else None}
    return result, params, summary


def _with_scaling(table: pl.DataFrame, result: LatentScaling) -> pl.DataFrame:
    kept = table.drop([c for c in SCALING_COLUMNS if c in table.columns])
    return kept.with_columns(**{k: pl.Series(k, v) for k, v in result.columns(table.height).items()})


def run_train_crosscoder(ctx: AtlasContext, params: CrosscoderParams, *, corpus: CorpusSpec | None = None,
                         device: str = "cpu", progress: bool = True) -> CrosscoderRun:
    """Train a crosscoder between `hook_a` of the atlas's model and `hook_b` of `model_b`
    (default: the same model) on `n_tokens` training tokens, streamed in passes of
    `pass_tokens` corpus tokens (default `n_tokens`), and store it with its relative norms;
    with `scaling_tokens` > 0 also the Latent Scaling of its latents over that many corpus
    tokens."""
    hook_a, hook_b, model_b, d_sae, k = params.hook_a, params.hook_b, params.model_b, params.d_sae, params.k
    n_tokens, pass_tokens, batch_size, batch_blocks = (params.tokens, params.pass_tokens, params.batch_size,
                                                       params.batch_blocks)
    cc_id, seed, scaling_tokens = params.cc_id, params.seed, params.scaling_tokens
    model_b = model_b_spec(model_b)
    root = ctx.root
    a, b = _sides(ctx, hook_a, hook_b, model_b, device)
    if scaling_tokens:
        _check_scalable(a, b)
    corpus = corpus or CorpusSpec()
    cc_id = check_id(cc_id, "crosscoder id") if cc_id else default_crosscoder_id(hook_a, hook_b, d_sae)

    def one_pass(epoch: int) -> Iterator[torch.Tensor]:
        return paired_batches(_rows(a, b, corpus, pass_tokens or n_tokens, batch_blocks), batch_size,
                              seed=seed + epoch)

    def paired(skip: int) -> Iterator[torch.Tensor]:
        return itertools.islice(itertools.chain.from_iterable(one_pass(e) for e in itertools.count()), skip, None)

    sides = {"model_a": a.handle.name, "hook_a": hook_a, "model_b": b.handle.name, "hook_b": hook_b,
             "spec_b": model_b}
    cfg = TrainConfig(total_tokens=n_tokens, batch_size=batch_size, seed=seed, device=device, progress=progress)
    with ctx.model_lock:
        result, scales = train_crosscoder(paired, a.handle.d_model, b.handle.d_model, d_sae=d_sae, k=k,
                                          train_cfg=cfg, out_dir=crosscoder_dir(root, cc_id), sides=sides)
    params = {**sides, "d_sae": d_sae, "k": k, "n_tokens": n_tokens, "pass_tokens": pass_tokens or n_tokens,
              "batch_size": batch_size, "corpus": corpus.__dict__, "seed": seed, "folder": f"crosscoders/{cc_id}"}
    table, summary = relative_norm_table(result.sae, scales, result.final_metrics)
    if scaling_tokens:
        scaled, params["latent_scaling"], scaling_summary = _scaling(ctx, result.sae, scales, a, b, corpus,
                                                                     scaling_tokens, batch_blocks, table)
        table, summary = _with_scaling(table, scaled), {**summary, **scaling_summary}
    write_analysis(root, KIND, cc_id, parameters=params, summary=summary, tables={"main": table})
    return analysis_as(CrosscoderRun, Path(root), KIND, cc_id)


def relative_norm_table(sae: SAE, scales: SideScales, final_metrics: dict[str, Any]
                        ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """A trained crosscoder's analysis table (each latent's side norms, relative norm and
    class) and summary (the classes' counts, the side scales, the final training metrics)."""
    norms = relative_norms(sae, scales.d_a)
    table = pl.DataFrame({"latent": np.arange(sae.cfg.d_sae, dtype=np.int32), "norm_a": norms.norm_a,
                          "norm_b": norms.norm_b, "relative_norm": norms.relative, "latent_class": norms.latent_class})
    counts = {c: int((norms.latent_class == c).sum()) for c in ("a_only", "shared", "b_only")}
    return table, {**counts, "scale_a": scales.scale_a, "scale_b": scales.scale_b,
                   **{k_: v for k_, v in final_metrics.items() if isinstance(v, float | int)}}


def run_latent_scaling(ctx: AtlasContext, params: LatentScalingParams, *, corpus: CorpusSpec | None = None,
                       device: str = "cpu") -> CrosscoderRun:
    """Latent Scaling of the latents of stored crosscoder `params.cc_id` over `params.tokens`
    tokens of `corpus` (default: its training corpus), added as columns of
    `analyses/crosscoder/<id>` (replacing earlier ones)."""
    root, cc_id = ctx.root, params.cc_id
    _, meta, table = analysis_run(Path(root), KIND, cc_id)
    if table is None:
        raise InvalidInputError(f"crosscoder run {cc_id!r} has no table; train it again (`sae-atlas train-crosscoder`)")
    stored_params = meta["parameters"]
    folder = crosscoder_dir(root, cc_id)
    stored = read_crosscoder_sides(folder)
    sae = load_saelens(folder, device=device)
    scales = SideScales(int(stored["d_a"]), float(stored["scale_a"]), float(stored["scale_b"]))
    a, b = _sides(ctx, stored_params["hook_a"], stored_params["hook_b"], stored_params.get("spec_b"), device)
    corpus = corpus or CorpusSpec(**stored_params["corpus"])
    scaled, stored_params["latent_scaling"], scaling_summary = _scaling(ctx, sae, scales, a, b, corpus,
                                                                        params.tokens, params.batch_blocks, table)
    write_analysis(root, KIND, cc_id, parameters=stored_params, summary={**meta["summary"], **scaling_summary},
                   tables={"main": _with_scaling(table, scaled)})
    return analysis_as(CrosscoderRun, Path(root), KIND, cc_id)
