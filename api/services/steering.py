"""The service layer of `steering`; its other layers: `sae_atlas.api.http.routers.steering` (HTTP),
`sae_atlas.api.operations.steering` (parameter), `sae_atlas.api.results.steering`
(typed-result), `sae_atlas.store.steering` (persistence).

Steering toward a target: the SAEs' features ranked by measured effect, each with a
calibrated strength and a ready edit (the model runs in `saes.intervene.steering_search`).
Every SAE searched needs its summaries (typical active values) and its steering table
(`sae-atlas steering-scores`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.steering import (
    CategorySpec,
    SteerBenchParams,
    SteeringScoresParams,
    SteeringSearchParams,
)
from sae_atlas.api.results.steering import SteerBench, SteeringSearch
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services.labels import with_labels
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.intervene.output_scores import SteeringReport, compute_steering_scores
from sae_atlas.saes.intervene.steer_bench import BenchParams, share_table
from sae_atlas.saes.intervene.steer_bench import steer_bench as run_bench
from sae_atlas.saes.intervene.steering_search import SteeringSource, rank_features
from sae_atlas.store.atomic import file_version
from sae_atlas.store.steering import STEERING_META, read_steering

Progress = Callable[[str, int, int], None]


def steering_source(view: SaeView, *, reads_its_hook: bool) -> SteeringSource:
    """What a search needs of one SAE: NotFoundError naming the command to run when it has
    no summaries or no steering table; IntegrityError when either is damaged. A
    transcoder's features are added where it writes; a search that also encodes at that
    hook (`reads_its_hook`: clamping, the bench's classes) refuses it."""
    if view.hook_out and reads_its_hook:
        raise InvalidInputError(f"{view.sae_id!r} is a transcoder (reads {view.hook}, writes {view.hook_out}); "
                                "clamping and the steering bench need an SAE that reads the hook it writes")
    features = view.tables().features
    table, meta = view.ctx.cache.current(("steering", view.sae_id), file_version(view.folder / STEERING_META),
                                         lambda: read_steering(view.ctx.root, view.sae_id))
    p = meta["params"]
    return SteeringSource(view.sae_id, view.hook_out or view.hook, view.module(),
                          features["mean_active_act"].to_numpy(), table,
                          (int(p["n_prompts"]), int(p["prompt_tokens"]), int(p["seed"])),
                          features["density"].to_numpy() if "density" in features.columns else None)


def steering_features(ctx: AtlasContext, views: list[SaeView], options: SteeringSearchParams,
                      progress: Progress | None = None) -> SteeringSearch:
    """The features of `views` ranked by their measured effect toward the target (a token,
    tokens, a concept or a contrast), with the smallest strength reaching the ratio under
    the KL bound on the ranking prompts and its ready edit, ranked by what that edit does
    on held-out confirmation prompts of each style (the user's prompts among them); a few
    features are also fitted together (see `saes.intervene.steering_search`)."""
    params = options.search_params(k=options.k, seed=options.seed, mode=options.mode,
                                   include_dead=options.include_dead)
    target, prompts = options.core_target(), list(options.prompts)
    category = options.category.model_dump() if isinstance(options.category, CategorySpec) else options.category
    sources = [steering_source(view, reads_its_hook=params.mode == "clamp") for view in views]
    handle = ctx.model()
    result = ctx.run_locked(lambda: rank_features(handle, sources, target, params, progress, prompts=prompts,
                                                  category=category))
    pairs = [(f.sae_id, f.latent) for f in result.features]
    if result.combination is not None:
        pairs += [(result.combination.sae_id, latent) for latent in result.combination.latents]
    keys = pl.DataFrame({"sae_id": [s for s, _ in pairs], "latent": [i for _, i in pairs]},
                        schema={"sae_id": pl.String, "latent": pl.Int64}).unique(maintain_order=True)
    labelled = with_labels(ctx, keys, {view.sae_id: view for view in views})
    labels = {(s, int(i)): label for s, i, label in labelled.select("sae_id", "latent", "label").iter_rows()}
    return SteeringSearch.build(result, labels)


def steer_bench(ctx: AtlasContext, views: list[SaeView], options: SteerBenchParams,
                progress: Callable[[str], None] | None = None) -> SteerBench:
    """The AxBench-style comparison of `saes.intervene.steer_bench` on each target: the best
    feature (added and clamped), the fitted combination, the top-activating feature, a
    difference of means, a probe, a random feature (matched norms) and prompting, each
    calibrated on the ranking prompts and counted on the held-out ones of each style."""
    search = options.search_params(k=3, fluency_prompts=0)
    sources = [steering_source(view, reads_its_hook=True) for view in views]
    handle = ctx.model()
    params = BenchParams(search=search, prompt_prefix=options.prompt_prefix)
    targets, prompts = options.core_targets(), list(options.prompts)
    rows = [asdict(r) for r in ctx.run_locked(lambda: run_bench(handle, sources, targets, params, progress,
                                                                prompts=prompts))]
    return SteerBench(search.ratio, search.kl_bound, search.n_prompts, options.prompt_prefix, rows,
                      share_table(rows), list(search.styles))  # type: ignore[arg-type]


def steering_scores(ctx: AtlasContext, views: list[SaeView], params: SteeringScoresParams, *, progress: bool = False,
                    dist: DistContext | None = None) -> list[SteeringReport]:
    """Writes: each SAE's steering table (`saes.intervene.output_scores`), with the atlas's
    model; resumable, a current table kept unless `force`; under torchrun (`dist`) the ranks
    take the chunks in turn and rank 0 writes."""
    handle = ctx.model()
    return [compute_steering_scores(handle, ctx.root, view.sae_id, params.core(), progress=progress, ctx=dist,
                                    force=params.force) for view in views]
