"""Steering toward a target: the SAEs' features ranked by measured effect, each with a
calibrated strength and a ready edit (the model runs in `saes.intervene.steering_search`).
Every SAE searched needs its summaries (typical active values) and its steering table
(`sae-atlas steering-scores`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.steering import SteerBench, SteeringSearch
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services.labels import with_labels
from sae_atlas.saes.intervene.steer_bench import BenchParams, share_table
from sae_atlas.saes.intervene.steer_bench import steer_bench as run_bench
from sae_atlas.saes.intervene.steering_prompts import PROMPT_STYLES, PromptStyle, read_user_prompts
from sae_atlas.saes.intervene.steering_search import (
    SearchParams,
    SteeringSource,
    SteerMode,
    rank_features,
)
from sae_atlas.store.atomic import file_version
from sae_atlas.store.errors import InvalidInputError, NotFoundError
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


def steering_features(ctx: AtlasContext, views: list[SaeView], target: Any, *, k: int = 10, mode: SteerMode = "add",
                      ratio: float = 3.0, kl_bound: float = 1.0, n_prompts: int = 16, seed: int | None = None,
                      candidates: int = 24, fluency_prompts: int = 4, confirm_prompts: int = 16,
                      styles: Sequence[PromptStyle] = PROMPT_STYLES, prompts: Sequence[str] = (),
                      category: Any = None, include_dead: bool = False, combine: int = 3,
                      progress: Progress | None = None) -> SteeringSearch:
    """The features of `views` ranked by their measured effect toward `target` (a token,
    tokens, `{"kind": "concept" | "contrast", ...}`), with the smallest strength reaching
    `ratio` under `kl_bound` on the ranking prompts and its ready edit, ranked by what that
    edit does on held-out confirmation prompts of each style (the user's `prompts` among
    them); `combine` features are also fitted together (see `saes.intervene.steering_search`)."""
    params = SearchParams(k=k, candidates=candidates, n_prompts=n_prompts, seed=seed, mode=mode, ratio=ratio,
                          kl_bound=kl_bound, fluency_prompts=fluency_prompts, confirm_prompts=confirm_prompts,
                          styles=tuple(styles), include_dead=include_dead, combine=combine).check()
    if not views:
        raise NotFoundError(f"the atlas {ctx.root} has no SAEs yet")
    sources = [steering_source(view, reads_its_hook=mode == "clamp") for view in views]
    handle = ctx.model()
    user = read_user_prompts(prompts) if prompts else []
    result = ctx.run_locked(lambda: rank_features(handle, sources, target, params, progress, prompts=user,
                                                  category=category))
    pairs = [(f.sae_id, f.latent) for f in result.features]
    if result.combination is not None:
        pairs += [(result.combination.sae_id, latent) for latent in result.combination.latents]
    keys = pl.DataFrame({"sae_id": [s for s, _ in pairs], "latent": [i for _, i in pairs]},
                        schema={"sae_id": pl.String, "latent": pl.Int64}).unique(maintain_order=True)
    labelled = with_labels(ctx, keys, {view.sae_id: view for view in views})
    labels = {(s, int(i)): label for s, i, label in labelled.select("sae_id", "latent", "label").iter_rows()}
    return SteeringSearch.build(result, labels)


def steer_bench(ctx: AtlasContext, views: list[SaeView], targets: list[Any], *, ratio: float = 3.0,
                kl_bound: float = 1.0, n_prompts: int = 16, candidates: int = 24, seed: int | None = None,
                prompt_prefix: str = BenchParams.prompt_prefix, confirm_prompts: int = 16,
                styles: Sequence[PromptStyle] = PROMPT_STYLES, prompts: Sequence[str] = (), combine: int = 3,
                progress: Callable[[str], None] | None = None) -> SteerBench:
    """The AxBench-style comparison of `saes.intervene.steer_bench` on each target: the best
    feature (added and clamped), the fitted combination, the top-activating feature, a
    difference of means, a probe, a random feature (matched norms) and prompting, each
    calibrated on the ranking prompts and counted on the held-out ones of each style."""
    search = SearchParams(k=3, candidates=candidates, n_prompts=n_prompts, seed=seed, ratio=ratio, kl_bound=kl_bound,
                          fluency_prompts=0, confirm_prompts=confirm_prompts, styles=tuple(styles),
                          combine=combine).check()
    if not views:
        raise NotFoundError(f"the atlas {ctx.root} has no SAEs yet")
    sources = [steering_source(view, reads_its_hook=True) for view in views]
    handle = ctx.model()
    params = BenchParams(search=search, prompt_prefix=prompt_prefix)
    user = read_user_prompts(prompts) if prompts else []
    rows = [asdict(r) for r in ctx.run_locked(lambda: run_bench(handle, sources, targets, params, progress,
                                                                prompts=user))]
    return SteerBench(ratio, kl_bound, n_prompts, prompt_prefix, rows, share_table(rows),  # type: ignore[arg-type]
                      list(search.styles))
