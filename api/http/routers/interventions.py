"""The HTTP layer of `interventions`; its other layers: `sae_atlas.api.operations.interventions`
(parameter), `sae_atlas.api.results.interventions` (typed-result),
`sae_atlas.api.services.interventions` (service).

`POST /run`, `/steer`, `/attribute`: interventions on the atlas's model.

Off unless the server was started with `--allow-interventions` (403 otherwise). Each
request is its operation's parameters (`api.operations.interventions`), bounded (prompt
characters and tokens, new tokens, edits; see `api.bounds`), and runs on the worker's
one-thread model queue, first come first served, like text search."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep, SettingsDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, error_responses
from sae_atlas.api.http.schemas import ErrorBody
from sae_atlas.api.operations.interventions import AttributeParams, RunParams, SteerParams
from sae_atlas.api.results.interventions import AttributionView, RunView, SteerView

MODEL_BOUND = {400: {"model": ErrorBody, "description": (
    "input that only the model can judge: a prompt of more tokens than allowed, an edit position or token match "
    "outside the prompt, a target that is not exactly one token of the vocabulary")}}
router = APIRouter(tags=["interventions"],
                   responses={**DATA_ERRORS, **error_responses(403, 404, 413), **MODEL_BOUND})


class RunRequest(RunParams):
    """A forward pass with SAEs spliced in and edits applied (`api.operations.interventions.RunParams`;
    the old field name `sae_ids` is still accepted)."""


class SteerRequest(SteerParams):
    """Baseline vs edited generation with one seed (`api.operations.interventions.SteerParams`;
    the old field names `sae_ids` and `sae` are still accepted)."""


class AttributeRequest(AttributeParams):
    """Feature attribution of a target on the prompt (`api.operations.interventions.AttributeParams`;
    the old field name `sae_ids` is still accepted)."""


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
    return await _queued(queue, lambda: atlas.run(**body.model_dump()))


@router.post("/steer", summary="Generate without and with feature edits (same seed)", response_model=SteerView)
async def post_steer(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep, body: SteerRequest) -> Response:
    require_interventions(settings)
    return await _queued(queue, lambda: atlas.steer(**body.model_dump()))


@router.post("/attribute", summary="Attribute a target to SAE features (activation x gradient)",
             response_model=AttributionView)
async def post_attribute(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep,
                         body: AttributeRequest) -> Response:
    require_interventions(settings)
    return await _queued(queue, lambda: atlas.attribute(**body.model_dump()))
