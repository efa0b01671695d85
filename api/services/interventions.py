"""The service layer of `interventions`; its other layers:
`sae_atlas.api.http.routers.interventions` (HTTP), `sae_atlas.api.operations.interventions`
(parameter), `sae_atlas.api.results.interventions` (typed-result).

Interventions on an atlas's model (the model runs in `saes.intervene`): the parameters
come checked (`api.operations.interventions`), edit specs are resolved against the atlas
(SAE weights, feature means from the summaries, circle planes from stored concept runs),
the prompt is checked against the model (its tokens) and the results wrapped for display."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

import torch

from sae_atlas.api.analyses.circular import read_circle_plane
from sae_atlas.api.bounds import MAX_PROMPT_TOKENS
from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.interventions import AttributeParams, RunParams, SteerParams
from sae_atlas.api.results.interventions import AttributionView, RunView, SteerView
from sae_atlas.api.sae_view import SaeView, open_sae
from sae_atlas.api.services.labels import labelled_token_features
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.tokens import decoded_tokens
from sae_atlas.saes.intervene.attribution import attribute
from sae_atlas.saes.intervene.edits import CirclePlane, Edit
from sae_atlas.saes.intervene.generate import DecodeStep, Generation, compare_steps, run_to_end
from sae_atlas.saes.intervene.splice import Splice, build_splice, run_spliced
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE


class AtlasEditSources:
    """`saes.intervene.splice.EditSources` over an atlas: SAEs opened (and checked) once each."""

    def __init__(self, ctx: AtlasContext, views: Sequence[SaeView] = ()) -> None:
        self.ctx = ctx
        self.views = {view.sae_id: view for view in views}

    def view(self, sae_id: str) -> SaeView:
        """The SAE's view, opened on first use."""
        if sae_id not in self.views:
            self.views[sae_id] = open_sae(self.ctx, sae_id)
        return self.views[sae_id]

    def sae(self, sae_id: str) -> SAE:
        return self.view(sae_id).module()

    def hook(self, sae_id: str) -> str:
        return self.view(sae_id).hook

    def feature_mean(self, sae_id: str, feature: int) -> float | None:
        """The feature's mean activation from the summaries; None if not summarized."""
        return self.view(sae_id).feature_mean(feature)

    def plane(self, run: str, layer: int | None) -> CirclePlane:
        plane = read_circle_plane(self.ctx.root, run, layer)
        self.ctx.model().check_hook(plane.hook)
        return plane

    def check_features(self, specs: list[Edit]) -> None:
        """Every feature the edits name exists in its SAE (NotFoundError otherwise)."""
        for spec in specs:
            if getattr(spec, "sae", None) is not None:
                for feature in spec.features if spec.kind == "project_out" else [spec.feature]:
                    self.view(spec.sae).latent(feature)


def _tokenize(handle: ModelHandle, text: str, room: int = 0) -> tuple[torch.Tensor, list[str]]:
    """Token ids `[T]` (BOS first) and decoded token strings of a checked prompt within the
    token bounds, with `room` positions left in the model's context for generated tokens."""
    n = len(handle.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
    limit = min(MAX_PROMPT_TOKENS, int(handle.bridge.cfg.n_ctx) - room)
    if n > limit:
        raise InvalidInputError(f"the prompt is {n} tokens; the maximum is {limit}"
                                + (f" (leaving {room} for generation)" if room else ""))
    ids = handle.to_tokens(text)[0]
    return ids, decoded_tokens(handle.tokenizer, ids.tolist())


def run(ctx: AtlasContext, views: list[SaeView], params: RunParams) -> RunView:
    """Splice `views` (and every SAE an edit names) into the model, apply the edits, and
    return the tokens, the next-token predictions and each SAE's feature activations (labelled)."""
    specs = params.core_edits()
    sources = AtlasEditSources(ctx, views)
    sources.check_features(specs)
    handle = ctx.model()
    tokens_T, toks = _tokenize(handle, params.text)
    splice = build_splice(sources, [view.sae_id for view in views], specs, toks)
    with ctx.model_lock:
        out = run_spliced(handle, tokens_T, splice)
        clean = run_spliced(handle, tokens_T, build_splice(sources, list(splice.saes), [], toks))
    result = RunView.build(handle.tokenizer, params.text, toks, tokens_T.tolist(), out, clean, specs, k=params.k)
    result.features = labelled_token_features(ctx, result.features, {view.sae_id: view for view in views})
    return result


@dataclass(frozen=True)
class SteerInputs:
    """A checked steer request, ready to generate: the prompt's ids `[T]`, the edit specs and
    the baseline (SAEs spliced, no edits) and edited splices."""

    handle: ModelHandle
    text: str
    tokens_T: torch.Tensor
    specs: list[Edit]
    baseline: Splice
    edited: Splice
    max_new_tokens: int
    temperature: float
    seed: int

    def steps(self) -> Generator[DecodeStep, None, Generation]:
        """The generation's steps (`compare_steps`; run them holding the model lock)."""
        return compare_steps(self.handle, self.text, self.tokens_T, self.baseline, self.edited,
                             max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed)

    def view(self, gen: Generation) -> SteerView:
        """The generation's result."""
        return SteerView.build(gen, self.specs, temperature=self.temperature, seed=self.seed)


def steer_inputs(ctx: AtlasContext, views: list[SaeView], params: SteerParams) -> SteerInputs:
    """Check a steer request against the atlas and the model, tokenize it and build its splices."""
    specs = params.core_edits()
    sources = AtlasEditSources(ctx, views)
    sources.check_features(specs)
    handle = ctx.model()
    n_new = params.max_new_tokens
    tokens_T, toks = _tokenize(handle, params.text, room=n_new)
    edited = build_splice(sources, [view.sae_id for view in views], specs, toks, n_total=len(toks) + n_new)
    baseline = build_splice(sources, list(edited.saes), [], toks)
    return SteerInputs(handle, params.text, tokens_T, specs, baseline, edited, n_new, params.temperature, params.seed)


def steer(ctx: AtlasContext, views: list[SaeView], params: SteerParams) -> SteerView:
    """Generate from the prompt without and with the edits (same seed) and report the shift."""
    inputs = steer_inputs(ctx, views, params)
    with ctx.model_lock:
        gen = run_to_end(inputs.steps())
    return inputs.view(gen)


def attribute_text(ctx: AtlasContext, views: list[SaeView], params: AttributeParams) -> AttributionView:
    """Attribute the target to the features of `views` on the prompt, with the completeness
    and ablation checks."""
    handle = ctx.model()
    tokens_T, toks = _tokenize(handle, params.text)
    splice = build_splice(AtlasEditSources(ctx, views), [view.sae_id for view in views], [], toks)
    with ctx.model_lock:
        result = attribute(handle, tokens_T, splice, params.core_target(), top=params.top, verify=params.verify,
                           mode=params.mode)
    return AttributionView.build(params.text, toks, result)
