"""Interventions on an atlas's model (the model runs in `saes.intervene`): requests are
checked against `api.bounds`, edit specs are resolved against the atlas (SAE weights,
feature means from the summaries, circle planes from stored concept runs) and the
results wrapped for display."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import torch
from pydantic import TypeAdapter, ValidationError

from sae_atlas.api.analyses.circular import read_circle_plane
from sae_atlas.api.bounds import (
    MAX_ATTRIBUTED,
    MAX_EDITS,
    MAX_NEW_TOKENS,
    MAX_NEXT_TOKENS,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_TOKENS,
    MAX_TEMPERATURE,
    MAX_VERIFIED,
    check_int,
)
from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.interventions import AttributionView, RunView, SteerView
from sae_atlas.api.sae_view import SaeView, open_sae
from sae_atlas.api.services.labels import labelled_token_features
from sae_atlas.saes.encoding.tokens import decoded_tokens
from sae_atlas.saes.intervene.attribution import AttributionMode, Target, attribute
from sae_atlas.saes.intervene.edits import CirclePlane, Edit
from sae_atlas.saes.intervene.generate import DecodeStep, Generation, compare_steps, run_to_end
from sae_atlas.saes.intervene.splice import Splice, build_splice, run_spliced
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.store.errors import InvalidInputError, NotFoundError

_EDITS = TypeAdapter(list[Edit])
ATTRIBUTION_MODES: tuple[AttributionMode, ...] = get_args(AttributionMode)


def _validation_message(exc: ValidationError) -> str:
    """Each problem (at most five) as `field: message`, a rule of the whole model as its message."""
    problems = []
    for err in exc.errors()[:5]:
        message = err["msg"].removeprefix("Value error, ")
        problems.append(f"{'.'.join(str(x) for x in err['loc'])}: {message}" if err["loc"] else message)
    return "; ".join(problems)


def parse_edits(edits: Sequence[Any] | None) -> list[Edit]:
    """Edit specs from pydantic models or dicts (`{"kind": "steer", ...}`), at most
    `MAX_EDITS`; InvalidInputError names each bad field."""
    edits = list(edits or [])
    if len(edits) > MAX_EDITS:
        raise InvalidInputError(f"{len(edits)} edits; at most {MAX_EDITS} per request")
    try:
        return _EDITS.validate_python([e.model_dump() if hasattr(e, "model_dump") else e for e in edits])
    except ValidationError as exc:
        raise InvalidInputError(f"invalid edit: {_validation_message(exc)} "
                                "(kinds: steer, clamp, scale, ablate, project_out, rotate)") from exc


def parse_target(target: Any) -> Target:
    """A `Target` from a model, a dict, or a token string / id (its logit)."""
    if isinstance(target, Target):
        return target
    if isinstance(target, (str, int)) and not isinstance(target, bool):
        target = {"kind": "logit", "token": target}
    try:
        return Target.model_validate(target)
    except ValidationError as exc:
        raise InvalidInputError(f"invalid target: {_validation_message(exc)}") from exc


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
    """Token ids `[T]` (BOS first) and decoded token strings of a prompt within the bounds,
    with `room` positions left in the model's context for generated tokens."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("the prompt must be a non-empty string")
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidInputError(f"the prompt is {len(text)} characters; the maximum is {MAX_PROMPT_CHARS}")
    n = len(handle.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
    limit = min(MAX_PROMPT_TOKENS, int(handle.bridge.cfg.n_ctx) - room)
    if n > limit:
        raise InvalidInputError(f"the prompt is {n} tokens; the maximum is {limit}"
                                + (f" (leaving {room} for generation)" if room else ""))
    ids = handle.to_tokens(text)[0]
    return ids, decoded_tokens(handle.tokenizer, ids.tolist())


def run(ctx: AtlasContext, views: list[SaeView], text: str, edits: Sequence[Any] | None, *, k: int) -> RunView:
    """Splice `views` (and every SAE an edit names) into the model, apply `edits`, and
    return the tokens, the next-token predictions and each SAE's feature activations (labelled)."""
    specs = parse_edits(edits)
    k = check_int(k, "k", 1, MAX_NEXT_TOKENS)
    sources = AtlasEditSources(ctx, views)
    sources.check_features(specs)
    handle = ctx.model()
    tokens_T, toks = _tokenize(handle, text)
    splice = build_splice(sources, [view.sae_id for view in views], specs, toks)
    with ctx.model_lock:
        out = run_spliced(handle, tokens_T, splice)
        clean = run_spliced(handle, tokens_T, build_splice(sources, list(splice.saes), [], toks))
    result = RunView.build(handle.tokenizer, text, toks, tokens_T.tolist(), out, clean, specs, k=k)
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


def steer_inputs(ctx: AtlasContext, views: list[SaeView], text: str, edits: Sequence[Any], *, max_new_tokens: int,
                 temperature: float, seed: int) -> SteerInputs:
    """Check a steer request against the bounds and the atlas, tokenize it and build its splices."""
    specs = parse_edits(edits)
    if not specs:
        raise InvalidInputError("steer needs at least one edit")
    max_new_tokens = check_int(max_new_tokens, "max_new_tokens", 1, MAX_NEW_TOKENS)
    if not 0 <= float(temperature) <= MAX_TEMPERATURE:
        raise InvalidInputError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {temperature!r}")
    sources = AtlasEditSources(ctx, views)
    sources.check_features(specs)
    handle = ctx.model()
    tokens_T, toks = _tokenize(handle, text, room=max_new_tokens)
    edited = build_splice(sources, [view.sae_id for view in views], specs, toks, n_total=len(toks) + max_new_tokens)
    baseline = build_splice(sources, list(edited.saes), [], toks)
    return SteerInputs(handle, text, tokens_T, specs, baseline, edited, max_new_tokens, float(temperature), seed)


def steer(ctx: AtlasContext, views: list[SaeView], text: str, edits: Sequence[Any], *, max_new_tokens: int,
          temperature: float, seed: int) -> SteerView:
    """Generate from `text` without and with `edits` (same seed) and report the shift."""
    inputs = steer_inputs(ctx, views, text, edits, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    with ctx.model_lock:
        gen = run_to_end(inputs.steps())
    return inputs.view(gen)


def attribute_text(ctx: AtlasContext, views: list[SaeView], text: str, target: Any, *, top: int, verify: int,
                   mode: AttributionMode) -> AttributionView:
    """Attribute `target` (a token, or a Target) to the features of `views` on `text`,
    with the completeness and ablation checks."""
    tgt = parse_target(target)
    if mode not in ATTRIBUTION_MODES:
        raise InvalidInputError(f"unknown attribution mode {mode!r}; valid: {', '.join(ATTRIBUTION_MODES)}")
    top = check_int(top, "top", 1, MAX_ATTRIBUTED)
    verify = check_int(verify, "verify", 0, MAX_VERIFIED)
    if not views:
        raise NotFoundError(f"the atlas {ctx.root} has no SAEs yet")
    handle = ctx.model()
    tokens_T, toks = _tokenize(handle, text)
    splice = build_splice(AtlasEditSources(ctx, views), [view.sae_id for view in views], [], toks)
    with ctx.model_lock:
        result = attribute(handle, tokens_T, splice, tgt, top=top, verify=verify, mode=mode)
    return AttributionView.build(text, toks, result)
