"""The service layer of `depth`; its other layers: `sae_atlas.api.analyses.depth` (analysis-run),
`sae_atlas.api.http.routers.depth` (HTTP), `sae_atlas.api.operations.depth` (parameter),
`sae_atlas.api.results.depth` (typed-result).

The depth operation (`api.operations.depth.DepthParams`) run on an atlas's model: the
corpus stream, the per-family run, or model A against model B (`api.analyses.depth`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sae_atlas.api.operations.depth import DepthParams
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext, rank_and_world
from sae_atlas.saes.models import DEFAULT_MODEL, ModelHandle, load_model
from sae_atlas.store.layout import AtlasLayout

ONE_PROCESS = {
    "families": "a families run forwards each family's prompts once, in one process",
    "model_b": "a model pair's token subsample draws its seeded keys per batch of the paired stream, which ranks do "
               "not number alike (with two tokenizers each rank also reads its own documents and token budget), so "
               "ranks would not merge into the one-process run",
}
"""Why the modes other than the corpus stream refuse torchrun ranks."""


def model_b_handle(model_b: str) -> ModelHandle:
    """Model B of a pair run: an atlas directory's model, else a model spec."""
    layout = AtlasLayout(Path(model_b))
    if layout.atlas_json.exists():
        return load_model(layout.read_meta().get("model") or DEFAULT_MODEL)
    return load_model(model_b)


def run_depth_operation(atlas: str | Path, handle: ModelHandle, params: DepthParams, corpus: CorpusSpec, *,
                        ctx: DistContext | None = None, progress: bool = True) -> dict[str, Any] | None:
    """Run `params` on `handle` (model A) and store it as `analyses/depth/<run>` of `atlas`;
    the stored run's tables, summary, parameters and JSON path (None on torchrun ranks other
    than 0). Under torchrun only the corpus stream runs (`ONE_PROCESS` says why the others
    do not): InvalidInputError naming the rule."""
    from sae_atlas.api.analyses.depth import run_depth, run_depth_families, run_depth_pair

    mode = "families" if params.families is not None else "model_b" if params.model_b is not None else None
    if mode is not None and rank_and_world(ctx)[1] > 1:
        raise InvalidInputError(f"analyze depth --{mode.replace('_', '-')} runs in one process: {ONE_PROCESS[mode]}; "
                                "start it without torchrun")
    if params.families is not None:
        return run_depth_families(atlas, handle, params.families, params.layers, k=params.k, space=params.space,
                                  n_permutations=params.n_permutations, seed=params.seed, run=params.run_name())
    if params.model_b is not None:
        return run_depth_pair(atlas, handle, model_b_handle(params.model_b), corpus, params.layers, params.layers_b,
                              n_tokens=params.tokens, batch_blocks=params.batch_blocks, max_points=params.max_points,
                              k=params.k, mle_k=params.mle_k, n_boot=params.n_boot,
                              n_permutations=params.n_permutations, seed=params.seed, run=params.run_name(),
                              progress=progress)
    return run_depth(atlas, handle, corpus, params.layers, n_tokens=params.tokens, batch_blocks=params.batch_blocks,
                     max_points=params.max_points, k=params.k, mle_k=params.mle_k, n_boot=params.n_boot,
                     fit_fraction=params.fit_fraction, space=params.space, seed=params.seed, run=params.run_name(),
                     progress=progress, ctx=ctx, sae_ids=params.saes, checkpoint_every=params.checkpoint_every)
