"""`POST /run`, `/steer`, `/attribute`: interventions on the atlas's model.

Off unless the server was started with `--allow-interventions` (403 otherwise). Each
request is bounded (prompt characters and tokens, new tokens, edits; see
`api.bounds`) and runs on the worker's one-thread model queue, first come first
served, like text search."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response
from pydantic import Field

from sae_atlas.api.bounds import (
    MAX_ATTRIBUTED,
    MAX_EDITS,
    MAX_NEW_TOKENS,
    MAX_NEXT_TOKENS,
    MAX_PROMPT_CHARS,
    MAX_SAES_PER_QUERY,
    MAX_TEMPERATURE,
    MAX_VERIFIED,
)
from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep, SettingsDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, error_responses
from sae_atlas.api.http.schemas import ErrorBody, JsonInt, SafeId, _Strict, json_strict
from sae_atlas.api.operations.fields import PY_WHITESPACE
from sae_atlas.api.results.interventions import AttributionView, RunView, SteerView
from sae_atlas.saes.intervene.attribution import AttributionMode, Target
from sae_atlas.saes.intervene.edits import Edit

MODEL_BOUND = {400: {"model": ErrorBody, "description": (
    "input that only the model can judge: a prompt of more tokens than allowed, an edit position or token match "
    "outside the prompt, a target that is not exactly one token of the vocabulary")}}
router = APIRouter(tags=["interventions"],
                   responses={**DATA_ERRORS, **error_responses(403, 404, 413), **MODEL_BOUND})


StrictEdits = json_strict(list[Edit])
StrictTarget = json_strict(Target | Annotated[str, Field(min_length=1, description="a token: its logit")])


class _Request(_Strict):
    text: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS, pattern=f"[^{PY_WHITESPACE}]",
                      description="the prompt (at least one non-space character)")


class RunRequest(_Request):
    """A forward pass with SAEs spliced in and edits applied."""

    edits: StrictEdits = Field(default_factory=list, max_length=MAX_EDITS)
    sae_ids: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                         description="SAEs to splice in besides those the edits name")
    k: JsonInt = Field(default=10, ge=1, le=MAX_NEXT_TOKENS, description="next tokens to list")


class SteerRequest(_Request):
    """Baseline vs edited generation with one seed."""

    edits: StrictEdits = Field(min_length=1, max_length=MAX_EDITS)
    max_new_tokens: JsonInt = Field(default=20, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(default=0.0, ge=0.0, le=MAX_TEMPERATURE, description="0: greedy")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1)


class AttributeRequest(_Request):
    """Feature attribution of a target on the prompt."""

    target: StrictTarget = Field(description="a token string (its logit at the last position) or a target")
    sae_ids: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                         description="SAEs to attribute to (default: all)")
    top: JsonInt = Field(default=20, ge=1, le=MAX_ATTRIBUTED)
    verify: JsonInt = Field(default=5, ge=0, le=MAX_VERIFIED, description="top features checked by true ablation")
    mode: AttributionMode = Field(default="linearized", description="linearized: parts sum to the target; "
                                  "gradient: the model's own gradient")


def require_interventions(settings: Any) -> None:
    """403 unless the server was started with `--allow-interventions`."""
    if not settings.allow_interventions:
        raise HTTPException(status_code=403,
                            detail="interventions are off on this server; start it with --allow-interventions")


async def _queued(queue: Any, work: Any) -> Response:
    result = await asyncio.get_running_loop().run_in_executor(queue, work)
    return json_body(result.to_dict())


@router.post("/run", summary="Run the model with SAEs spliced in and features edited", response_model=RunView)
async def post_run(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep, body: RunRequest) -> Response:
    require_interventions(settings)
    ids = body.sae_ids or []
    return await _queued(queue, lambda: atlas.run(body.text, body.edits, sae_ids=ids, k=body.k))


@router.post("/steer", summary="Generate without and with feature edits (same seed)", response_model=SteerView)
async def post_steer(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep, body: SteerRequest) -> Response:
    require_interventions(settings)
    return await _queued(queue, lambda: atlas.steer(body.text, body.edits, max_new_tokens=body.max_new_tokens,
                                                    temperature=body.temperature, seed=body.seed))


@router.post("/attribute", summary="Attribute a target to SAE features (activation x gradient)",
             response_model=AttributionView)
async def post_attribute(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep,
                         body: AttributeRequest) -> Response:
    require_interventions(settings)
    ids = body.sae_ids or None
    return await _queued(queue, lambda: atlas.attribute(body.text, body.target, sae_ids=ids, top=body.top,
                                                        verify=body.verify, mode=body.mode))
