"""The service layer of `build`; its other layers: `sae_atlas.api.operations.build` (parameter),
`sae_atlas.api.results.build` (typed-result).

Building an atlas over its context: the activation cache, the feature summaries (from
the cache or streamed from the model, under torchrun too), the offline labels that come with
them, and the FAISS indexes. The model is the context's (`AtlasContext.model`), run under
its lock; each write leaves atlas.json re-read."""

from __future__ import annotations

import warnings
from typing import Any, cast

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.build import CacheParams, IndexParams, SummarizeParams
from sae_atlas.api.results.build import IndexInfo
from sae_atlas.api.sae_view import SaeView, open_sae
from sae_atlas.api.services import labels
from sae_atlas.errors import AtlasError, InvalidInputError, NotFoundError
from sae_atlas.saes.cache import CacheSummary, cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.devices import resolve_device
from sae_atlas.saes.distributed import DistContext, init_distributed
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.summary.accumulator import SummaryParams
from sae_atlas.saes.summary.run import SummaryReport, summarize_sae
from sae_atlas.store.index import build_atlas_indexes


def run_model(ctx: AtlasContext, device: str | None) -> tuple[ModelHandle, DistContext | None]:
    """The context's model on `device` (None: the process default), as this torchrun rank
    sees it (its own GPU under nccl), and the rank's process group (None in one process)."""
    dist = init_distributed()
    where = str(resolve_device(device))
    return ctx.model(dist.device(where) if dist else where), dist


def cache(ctx: AtlasContext, params: CacheParams, *, corpus: CorpusSpec | None, device: str | None,
          progress: bool) -> CacheSummary:
    """Cache `params.hooks` (or `params.layers` spread layers) of the context's model over
    `params.tokens` tokens of `corpus` (`saes.cache.cache_activations`: resumable; under
    torchrun each rank writes its share of the shards)."""
    handle, dist = run_model(ctx, device)
    hooks = list(params.hooks or handle.default_hooks(params.layers))
    try:
        return ctx.run_locked(lambda: cache_activations(
            handle, ctx.root, hooks, corpus=corpus or CorpusSpec(), n_tokens=params.tokens, dtype=params.dtype,
            batch_blocks=params.batch_blocks, shard_blocks=params.shard_blocks, progress=progress, ctx=dist))
    finally:
        ctx.reread_meta()


def _logit_inputs(ctx: AtlasContext, device: str | None) -> dict[str, Any]:
    """Unembedding, final norm and tokenizer of the context's model (on `device`), or {} with
    a warning (no model recorded, or it does not load: the summaries go without logit effects)."""
    try:
        handle = ctx.model(device)
    except NotFoundError:
        warnings.warn("no model recorded in atlas.json: summarizing without logit effects", stacklevel=3)
        return {}
    except AtlasError as exc:
        warnings.warn(f"cannot load the atlas's model ({exc}): summarizing without logit effects", stacklevel=3)
        return {}
    return {"W_U": handle.W_U.detach(), "final_norm_weight": handle.final_norm_weight,
            "norm_kind": handle.final_norm_kind, "tokenizer": handle.tokenizer}


def summarize(ctx: AtlasContext, views: list[SaeView], params: SummarizeParams, *, corpus: CorpusSpec | None,
              device: str | None, progress: bool) -> list[SummaryReport]:
    """Summarize the SAEs of `views` over their held-out cached tokens, or (`from_model`) over
    `params.tokens` tokens of `corpus` streamed through the context's model, then store the
    offline labels of the tables written. Under torchrun the ranks split the batches, rank 0
    writes the tables and every other rank returns no reports."""
    ids = [view.sae_id for view in views]
    if params.from_model:
        reports = _summarize_streamed(ctx, ids, params, corpus or CorpusSpec(), device, progress)
    else:
        model = _logit_inputs(ctx, device) if params.with_model else {}
        reports = [summarize_sae(ctx.root, sae_id, n_tokens=params.tokens, top_k=params.top_k,
                                 window=(params.before, params.after), seed=params.seed, force=params.force,
                                 progress=progress, **model) for sae_id in ids]
    store_labels(ctx, reports)
    return reports


def _summarize_streamed(ctx: AtlasContext, ids: list[str], params: SummarizeParams, corpus: CorpusSpec,
                        device: str | None, progress: bool) -> list[SummaryReport]:
    from sae_atlas.saes.summary.stream import summarize_from_model

    if params.tokens is None:
        raise InvalidInputError("from_model (--from-model) needs --tokens (tokens): how many corpus tokens to stream")
    if ctx.model_override is None and ctx.meta.get("model") is None:
        raise InvalidInputError(f"{ctx.layout.atlas_json} records no model; --from-model needs the atlas's model")
    handle, dist = run_model(ctx, device)
    summary = SummaryParams(top_k=params.top_k, window_before=params.before, window_after=params.after,
                            seed=params.seed)
    reports = ctx.run_locked(lambda: summarize_from_model(
        handle, ctx.root, ids, corpus=corpus, n_tokens=params.tokens, params=summary,
        batch_blocks=params.batch_blocks, checkpoint_every=params.checkpoint_every, with_logits=params.with_model,
        progress=progress, force=params.force, ctx=dist))
    return [] if dist is not None and not dist.is_main else reports


def store_labels(ctx: AtlasContext, reports: list[SummaryReport]) -> None:
    """Store the offline labels of the SAEs whose tables were kept (written tables carry
    their labels, stored with them under the summary lock)."""
    for report in reports:
        if report.skipped:
            labels.build_labels(open_sae(ctx, report.sae_id))


def index(ctx: AtlasContext, params: IndexParams) -> list[IndexInfo]:
    """Build (or keep, when current) the FAISS index of each chosen SAE and the model-wide
    one (`store.index.build_atlas_indexes`); their sidecars, `rebuilt` telling which were."""
    indexes = build_atlas_indexes(ctx.root, params.saes or None, rebuild=params.rebuild,
                                  approx_threshold=params.approx_threshold, seed=params.seed)
    return cast(list[IndexInfo], indexes)
