"""The service layer of `evals`; its other layers: `sae_atlas.api.http.routers.evals` (HTTP),
`sae_atlas.api.operations.evals` (parameter), `sae_atlas.api.results.evals` (typed-result).

The evaluation suite run over an atlas's context (`run_evals`) and one stored eval result
of one SAE, verified (`saes.eval.results.read_result`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.evals import EvalParams
from sae_atlas.api.results.evals import EvalResult
from sae_atlas.api.results.suite import EvalsFailed, SuiteResults
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.eval.results import read_result, result_repair, stored_evals
from sae_atlas.saes.eval.spec import EVAL_NAMES, EvalName

if TYPE_CHECKING:
    from sae_atlas.saes.distributed import DistContext


def eval_result(ctx: AtlasContext, sae_id: str, name: str) -> EvalResult:
    """The SAEBench-layout result of eval `name` on SAE `sae_id`: InvalidInputError for an
    unknown eval (listing the valid ones), NotFoundError for an unknown SAE or one without
    that result (naming the command that computes it), IntegrityError for a damaged one (a
    result without its sidecar included)."""
    if name not in EVAL_NAMES:
        raise InvalidInputError(f"unknown eval {name!r}; valid: {', '.join(EVAL_NAMES)}")
    eval_name = cast(EvalName, name)
    ctx.layout.require_sae(sae_id)
    if eval_name not in stored_evals(ctx.root, sae_id):
        raise NotFoundError(f"SAE {sae_id!r} has no {name} result; {result_repair(ctx.root, sae_id, eval_name)}")
    return cast(EvalResult, read_result(ctx.root, sae_id, eval_name))


NEEDS_MODEL: tuple[EvalName, ...] = ("sparse_probing",)
"""Evals that run the model whatever `no_model` says."""


def _configs(params: EvalParams) -> dict[EvalName, Any]:
    """Each named eval's config from the parameters, checked before anything runs (a hub
    probe set that cannot be read stops the run before any SAE)."""
    from sae_atlas.saes.eval.autointerp import autointerp_config
    from sae_atlas.saes.eval.core import CoreConfig
    from sae_atlas.saes.eval.ground_truth import ground_truth_config
    from sae_atlas.saes.eval.sparse_probing import (
        SparseProbingConfig,
        probe_sets,
        with_datasets,
        with_probe_file,
    )

    p = params
    if p.no_model and (needing := [n for n in p.suite if n in NEEDS_MODEL]):
        raise InvalidInputError(f"suite {','.join(needing)} runs the model; drop --no-model (no_model)")
    if "ground_truth" in p.suite and p.ground_truth is None:
        raise InvalidInputError("suite ground_truth needs --ground-truth (ground_truth): a .safetensors file "
                                "with W_dec [n_atoms, d]")
    configs: dict[EvalName, Any] = {
        "core": CoreConfig(p.tokens, p.ce_blocks, not (p.no_model or p.from_model),
                           "stream" if p.from_model else "heldout"),
    }
    if "sparse_probing" in p.suite:
        sparse = SparseProbingConfig()
        if p.probe_sets or p.per_class:
            sparse = with_datasets(sparse, p.probe_sets or list(sparse.datasets), p.per_class)
            probe_sets(sparse)
        configs["sparse_probing"] = sparse if p.probe_data is None else with_probe_file(sparse, p.probe_data,
                                                                                         p.label_field)
    if p.ground_truth is not None:
        configs["ground_truth"] = ground_truth_config(p.ground_truth)
    if "autointerp" in p.suite:
        configs["autointerp"] = autointerp_config(p.autointerp_backend, url=p.autointerp_url,
                                                  model=p.autointerp_model, n_latents=p.autointerp_latents,
                                                  negatives=p.autointerp_negatives)
    return configs


def _core_from_model(ctx: AtlasContext, ids: list[str], params: EvalParams, config: Any, corpus: CorpusSpec,
                     device: str, dist: DistContext | None) -> dict[str, dict[str, Any]] | None:
    """`core` over corpus tokens streamed through the model (every torchrun rank takes part;
    rank 0 writes eval.json and the core results); None on the other ranks. Always
    recomputed: the ranks share one pass over the tokens for all SAEs."""
    from sae_atlas.saes.eval.core import CORE, core_outcome
    from sae_atlas.saes.eval.from_model import evaluate_from_model
    from sae_atlas.saes.eval.results import write_result

    started = time.perf_counter()
    records = evaluate_from_model(ctx.model(device), ctx.root, ids, corpus=corpus, n_tokens=params.tokens,
                                  batch_blocks=params.batch_blocks, ctx=dist)
    if dist is not None and not dist.is_main:
        return None
    for sae_id, record in records.items():
        write_result(ctx.root, sae_id, CORE, config, core_outcome(record), time.perf_counter() - started)
    return records


def run_evals(ctx: AtlasContext, params: EvalParams, *, corpus: CorpusSpec | None = None, device: str | None = None,
              progress: bool = True) -> SuiteResults | None:
    """Writes: the suite `params.suite` on the SAEs `params.saes` (default every trained one),
    each result in `saes/<id>/evals/<eval>.json` (core also in eval.json), the atlas's model
    loaded once through `ctx` on `device` and run under its lock. Under torchrun the ranks
    take the (SAE, eval) jobs in turn (with `from_model` they first split the batches of the
    streamed `core`); None on ranks other than 0. EvalsFailed (carrying the results) when
    some evals failed."""
    from sae_atlas.saes.devices import resolve_device
    from sae_atlas.saes.distributed import init_distributed
    from sae_atlas.saes.eval.evaluate import read_eval
    from sae_atlas.saes.eval.suite import run_suite

    ids = list(params.saes or ctx.sae_ids())
    if not ids:
        raise InvalidInputError(f"no trained SAEs in {ctx.root}; run `sae-atlas train {ctx.root}` first")
    for sae_id in ids:
        ctx.layout.require_sae(sae_id)
    configs = _configs(params)
    dist = init_distributed()
    where = str(resolve_device(device))
    rank_device = dist.device(where) if dist else where
    done = SuiteResults(list(params.suite))
    names = list(params.suite)
    with ctx.model_lock:
        if params.from_model and "core" in names:
            streamed = _core_from_model(ctx, ids, params, configs["core"], corpus or CorpusSpec(), rank_device, dist)
            done.core = streamed or {}
            names = [name for name in names if name != "core"]
        run = run_suite(ctx.root, ids, names, configs, device=rank_device, model=lambda: ctx.model(rank_device),
                        force=params.force, progress=progress, ctx=dist)
    if dist is not None and not dist.is_main:
        return None
    done.results, done.kept, done.failures = run.results, run.kept, run.failures
    if "core" in names:
        done.core = {sae_id: read_eval(ctx.root, sae_id) for sae_id, results in run.results.items()
                     if "core" in results}
    else:
        for sae_id in done.core:
            run.results[sae_id]["core"] = read_result(ctx.root, sae_id, "core")
    if run.failures:
        raise EvalsFailed("; ".join(f"{name} of SAE {sae_id!r} failed ({message})"
                                    for (sae_id, name), message in run.failures.items()), done)
    return done
