"""Interventions on an atlas's model: the glue between the Atlas facade and
`saes.intervene` (which runs the model). It validates requests against the bounds below,
resolves edit specs against the atlas (SAE weights, feature means from the summaries,
circle planes from stored concept runs) and wraps the results for display.

Bounds (Python, CLI and HTTP alike): prompts up to `MAX_PROMPT_TOKENS` tokens, at most
`MAX_NEW_TOKENS` generated tokens and `MAX_EDITS` edits per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from pydantic import TypeAdapter, ValidationError

from api.analyses.circular import read_circle_plane
from api.results.interventions import AttributionView, RunView, SteerView
from saes.intervene.attribution import Target, attribute
from saes.intervene.edits import CirclePlane, Edit
from saes.intervene.generate import compare
from saes.intervene.splice import build_splice, run_spliced
from saes.models import ModelHandle
from saes.sae.base import SAE
from store.errors import InvalidInputError, NotFoundError
from store.tables import FEATURES_FILE

if TYPE_CHECKING:
    from api.atlas import Atlas

MAX_PROMPT_TOKENS = 256
MAX_NEW_TOKENS = 64
MAX_EDITS = 16
MAX_CHARS = 16 * MAX_PROMPT_TOKENS
_EDITS = TypeAdapter(list[Edit])


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts[:5])


def parse_edits(edits: Sequence[Any] | None) -> list[Any]:
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
        return Target(kind="logit", token=target)
    try:
        return Target.model_validate(target)
    except ValidationError as exc:
        raise InvalidInputError(f"invalid target: {_validation_message(exc)}") from exc


class AtlasSources:
    """`saes.intervene.splice.EditSources` over an Atlas (checks ids and feature ranges)."""

    def __init__(self, atlas: Atlas) -> None:
        self.atlas = atlas

    def sae(self, sae_id: str) -> SAE:
        return self.atlas._sae(sae_id)

    def hook(self, sae_id: str) -> str:
        return self.atlas.sae_info(sae_id)["hook"]

    def feature_mean(self, sae_id: str, feature: int) -> float | None:
        """The feature's mean activation from the summaries; None if not summarized."""
        self.atlas._check_latent(sae_id, feature)
        if not (self.atlas.layout.require_sae(sae_id) / FEATURES_FILE).exists():
            return None
        return float(self.atlas._tables(sae_id).feature(feature)["mean_act"])

    def plane(self, run: str, layer: int | None) -> CirclePlane:
        plane = read_circle_plane(self.atlas.root, run, layer)
        self.atlas.model().check_hook(plane.hook)
        return plane


def _check_features(atlas: Atlas, specs: list[Any]) -> None:
    for spec in specs:
        if getattr(spec, "sae", None) is not None:
            for feature in spec.features if spec.kind == "project_out" else [spec.feature]:
                atlas._check_latent(spec.sae, feature)


def _tokenize(handle: ModelHandle, text: str, room: int = 0) -> tuple[torch.Tensor, list[str]]:
    """Token ids `[T]` (BOS first) and token strings of a prompt within the bounds, with
    `room` positions left in the model's context for generated tokens."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("the prompt must be a non-empty string")
    if len(text) > MAX_CHARS:
        raise InvalidInputError(f"the prompt is {len(text)} characters; the maximum is {MAX_CHARS}")
    n = len(handle.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
    limit = min(MAX_PROMPT_TOKENS, int(handle.bridge.cfg.n_ctx) - room)
    if n > limit:
        raise InvalidInputError(f"the prompt is {n} tokens; the maximum is {limit}"
                                + (f" (leaving {room} for generation)" if room else ""))
    ids = handle.to_tokens(text)[0]
    return ids, [handle.tokenizer.decode([int(i)]) for i in ids]


def _sae_ids(atlas: Atlas, sae_ids: Sequence[str] | None) -> list[str]:
    ids = list(sae_ids or [])
    for sid in ids:
        atlas.layout.require_sae(sid)
    return ids


def run(atlas: Atlas, text: str, edits: Sequence[Any] | None = None, *,
        sae_ids: Sequence[str] | None = None, k: int = 10) -> RunView:
    """Splice `sae_ids` (and every SAE an edit names) into the model, apply `edits`, and
    return the tokens, the next-token predictions and each SAE's feature activations."""
    specs = parse_edits(edits)
    _check_features(atlas, specs)
    ids = _sae_ids(atlas, sae_ids)
    handle = atlas.model()
    tokens_T, toks = _tokenize(handle, text)
    splice = build_splice(AtlasSources(atlas), ids, specs, toks)
    with atlas._model_lock:
        out = run_spliced(handle, tokens_T, splice)
        clean = run_spliced(handle, tokens_T, build_splice(AtlasSources(atlas), list(splice.saes), [], toks))
    return RunView.build(handle.tokenizer, text, toks, tokens_T.tolist(), out, clean, specs, k=k)


def steer(atlas: Atlas, text: str, edits: Sequence[Any], *, max_new_tokens: int = 20, temperature: float = 0.0,
          seed: int = 0, sae_ids: Sequence[str] | None = None) -> SteerView:
    """Generate from `text` without and with `edits` (same seed) and report the shift."""
    specs = parse_edits(edits)
    if not specs:
        raise InvalidInputError("steer needs at least one edit")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InvalidInputError(f"max_new_tokens must be an integer in 1..{MAX_NEW_TOKENS}, got {max_new_tokens!r}")
    if not 0 <= float(temperature) <= 10:
        raise InvalidInputError(f"temperature must be in [0, 10], got {temperature!r}")
    _check_features(atlas, specs)
    ids = _sae_ids(atlas, sae_ids)
    handle = atlas.model()
    tokens_T, toks = _tokenize(handle, text, room=max_new_tokens)
    sources = AtlasSources(atlas)
    edited = build_splice(sources, ids, specs, toks, n_total=len(toks) + max_new_tokens)
    baseline = build_splice(sources, list(edited.saes), [], toks)
    with atlas._model_lock:
        gen = compare(handle, text, tokens_T, baseline, edited, max_new_tokens=max_new_tokens,
                      temperature=float(temperature), seed=seed)
    return SteerView.build(gen, specs, temperature=float(temperature), seed=seed)


def attribute_text(atlas: Atlas, text: str, target: Any, *, sae_ids: Sequence[str] | None = None,
                   top: int = 20, verify: int = 5, mode: str = "linearized") -> AttributionView:
    """Attribute `target` (a token, or a Target) to the features of `sae_ids` (default:
    every SAE of the atlas) on `text`, with the completeness and ablation checks."""
    tgt = parse_target(target)
    if mode not in ("linearized", "gradient"):
        raise InvalidInputError(f"unknown attribution mode {mode!r}; valid: linearized, gradient")
    if not 1 <= top <= 200 or not 0 <= verify <= 20:
        raise InvalidInputError(f"top must be in 1..200 and verify in 0..20, got {top}, {verify}")
    ids = _sae_ids(atlas, sae_ids) or atlas.sae_ids
    if not ids:
        raise NotFoundError(f"the atlas {atlas.root} has no SAEs yet")
    handle = atlas.model()
    tokens_T, toks = _tokenize(handle, text)
    splice = build_splice(AtlasSources(atlas), ids, [], toks)
    with atlas._model_lock:
        result = attribute(handle, tokens_T, splice, tgt, top=top, verify=verify, mode=mode)
    return AttributionView.build(text, toks, result)
