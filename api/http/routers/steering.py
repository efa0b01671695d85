"""Steering that a user can aim: `GET/POST /steering/search` and `POST /steer/stream`.

`/steering/search` ranks the SAEs' features by their measured effect toward a target (a
token; in the body also several tokens, a concept or a contrast of two text sets), each
with a calibrated strength and a ready edit (`Atlas.steering_features`). It steers the model
on held-out prompts, so it runs on the worker's model queue, within the HTTP bounds below,
and only on a server started with `--allow-interventions` (403 otherwise).

`/steer/stream` takes `POST /steer`'s request, under the same bounds and switch, and streams
the generation token by token as server-sent events. The request is checked (and the prompt
tokenized) on the model queue before the answer starts, so bad input gets the usual 4xx JSON
error; then the generation runs on the queue, first come first served, holding the model for
its whole length, and each step is sent as it is decoded (`api.http.sse`). A client that
disconnects stops the generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import closing
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import Field

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.bounds import MAX_INDEX, MAX_K, MAX_SAES_PER_QUERY, MAX_TEXTS_PER_SET
from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep, SettingsDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.interventions import (
    MODEL_BOUND,
    SteerRequest,
    require_interventions,
)
from sae_atlas.api.http.routers.params import DATA_ERRORS, K, OneSae, error_responses
from sae_atlas.api.http.schemas import ErrorBody, JsonInt, SafeId, _Strict, json_strict
from sae_atlas.api.http.schemas_meaning import ConceptSpec, Text
from sae_atlas.api.http.sse import (
    MEDIA_TYPE,
    EventStream,
    component,
    data_schema,
    event_schema,
    event_stream,
)
from sae_atlas.api.results.interventions import SteerView
from sae_atlas.api.results.steer_stream import SteerTokens
from sae_atlas.api.results.steering import SteeringSearch
from sae_atlas.api.services.steer_stream import SteerStream
from sae_atlas.saes.intervene.steering_prompts import PROMPT_STYLES, PromptStyle
from sae_atlas.saes.intervene.steering_search import MAX_TARGET_TOKENS, SteerMode
from sae_atlas.saes.intervene.strength import MAX_KL_BOUND, MAX_RATIO

STREAM_EVENTS = (
    "Server-sent events, one per line pair `event: <name>` / `data: <JSON>`: a `token` event per decoding step "
    "(`SteerTokens`: the step, and the baseline's and the edited continuation's new token id and the text it "
    "adds, null once that continuation has ended), then one `done` event with the whole result (`SteerView`, "
    "what `POST /steer` answers to the same request); an error during the generation is a last `error` event "
    "(`ErrorBody`)")
STEER_ERRORS = {**DATA_ERRORS, **error_responses(403, 404, 413), **MODEL_BOUND}
STEER_EVENT = event_schema({"token": data_schema(SteerTokens), "done": component(SteerView.__name__),
                            "error": component(ErrorBody.__name__)})
SEARCH_BOUND = {400: {"model": ErrorBody, "description": (
    "input that only the model or the atlas can judge: a target token that is not one token of the vocabulary, "
    "a contrast without tokens over-represented in texts_a, a held-out seed equal to a steering table's, "
    "prompt styles that give the target fewer than 2 confirmation prompts (the confirmation set)")}}
MAX_HTTP_STEERING_PROMPTS = 32
"""Held-out prompts a search over HTTP measures each candidate on."""
MAX_HTTP_STEERING_CANDIDATES = 64
"""Candidates per SAE a search over HTTP measures."""
MAX_HTTP_USER_PROMPTS = 64
"""User prompts a search over HTTP ranks and confirms on."""
MAX_HTTP_COMBINE = 8
"""Features a fitted combination over HTTP may hold."""
TOKEN_DESCRIPTION = "a token as written in text (' Friday') or as the vocabulary spells it ('ĠFriday')"
TokenText = Annotated[str, Field(min_length=1, max_length=64, description=TOKEN_DESCRIPTION)]
router = APIRouter()


class SteeringTokens(_Strict):
    """Raise the probability of these next tokens (each one token of the vocabulary)."""

    kind: Literal["tokens"]
    tokens: list[TokenText | Annotated[JsonInt, Field(ge=0, le=MAX_INDEX)]] = Field(
        min_length=1, max_length=MAX_TARGET_TOKENS, description="token texts or ids")


class SteeringConcept(_Strict):
    """Raise a concept's values as next tokens (the first token of each value)."""

    kind: Literal["concept"]
    concept: Literal["weekdays", "months", "colours"] | ConceptSpec = Field(
        description="a built-in concept name or a concept of your own")


class SteeringContrast(_Strict):
    """Steer toward texts A and away from texts B (the tokens over-represented in A)."""

    kind: Literal["contrast"]
    texts_a: list[Text] = Field(min_length=1, max_length=MAX_TEXTS_PER_SET)
    texts_b: list[Text] = Field(min_length=1, max_length=MAX_TEXTS_PER_SET)


SteeringTarget = Annotated[SteeringTokens | SteeringConcept | SteeringContrast, Field(discriminator="kind")]
StrictSteeringTarget = json_strict(TokenText | SteeringTarget)


class SteeringQuery(_Strict):
    """Features ranked by their measured effect toward a target, with calibrated strengths."""

    target: StrictSteeringTarget = Field(description="a token, or a target of several tokens, a concept or a contrast")
    sae_ids: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                         description="SAEs to search (default: all)")
    k: JsonInt = Field(default=10, ge=1, le=MAX_K, description="features returned")
    mode: SteerMode = Field(default="add", description="add the decoder row (steer) or clamp the latent")
    ratio: float = Field(default=3.0, gt=1, le=MAX_RATIO, description="requested ratio of the target's probability")
    kl_bound: float = Field(default=1.0, gt=0, le=MAX_KL_BOUND,
                            description="bound on the KL (nats) over the other tokens")
    n_prompts: JsonInt = Field(default=16, ge=1, le=MAX_HTTP_STEERING_PROMPTS, description="held-out prompts")
    candidates: JsonInt = Field(default=24, ge=1, le=MAX_HTTP_STEERING_CANDIDATES, description="measured per SAE")
    seed: JsonInt | None = Field(default=None, ge=0, le=2**31 - 1,
                                 description="of the held-out prompts (default: one past the steering tables')")
    confirm_prompts: JsonInt = Field(default=16, ge=0, le=MAX_HTTP_STEERING_PROMPTS,
                                     json_schema_extra={"not": {"const": 1}},  # one prompt confirms nothing (400)
                                     description="held-out neutral prompts the ranking is confirmed on (0, or 2 "
                                                 "or more)")
    styles: list[PromptStyle] = Field(default=list(PROMPT_STYLES), min_length=1, max_length=len(PROMPT_STYLES),
                                      description="prompt styles ranked and confirmed on")
    prompts: list[Text] = Field(default=[], max_length=MAX_HTTP_USER_PROMPTS,
                                description="your own prompts (style user): half rank, half confirm")
    include_dead: bool = Field(default=False, description="also rank latents below the density floor, as directions")
    combine: JsonInt = Field(default=3, ge=0, le=MAX_HTTP_COMBINE, description="features in the fitted combination")


async def _search(atlas: Atlas, queue: Executor, target: Any, sae_ids: list[str] | None,
                  options: dict[str, Any]) -> Response:
    result = await asyncio.get_running_loop().run_in_executor(
        queue, lambda: atlas.steering_features(target, saes=sae_ids, **options))
    return json_body(result.to_dict())


@router.get("/steering/search", summary="Features that raise a token, ranked by measured steering effect",
            tags=["steering"], response_model=SteeringSearch, responses={**STEER_ERRORS, **SEARCH_BOUND})
async def get_steering_search(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep,
                              token: str = Query(min_length=1, max_length=64, description=TOKEN_DESCRIPTION),
                              sae_id: str | None = OneSae, k: int = K,
                              mode: SteerMode = Query("add", description="add (steer) or clamp"),
                              ratio: float = Query(3.0, gt=1, le=MAX_RATIO, description="requested probability ratio"),
                              kl_bound: float = Query(1.0, gt=0, le=MAX_KL_BOUND,
                                                      description="KL bound (nats) over the other tokens")) -> Response:
    require_interventions(settings)
    return await _search(atlas, queue, token, [sae_id] if sae_id else None,
                         {"k": k, "mode": mode, "ratio": ratio, "kl_bound": kl_bound})


@router.post("/steering/search", summary="Features that move the model toward a target, ranked by measured effect",
             tags=["steering"], response_model=SteeringSearch, responses={**STEER_ERRORS, **SEARCH_BOUND})
async def post_steering_search(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep,
                               body: SteeringQuery) -> Response:
    require_interventions(settings)
    target = body.target if isinstance(body.target, str) else body.target.model_dump()
    return await _search(atlas, queue, target, body.sae_ids or None,
                         body.model_dump(exclude={"target", "sae_ids"}))


def json_errors(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """Error answers documented as the JSON they are (FastAPI would give them the media type
    of the route's answer, an event stream)."""
    body = {"application/json": {"schema": component(ErrorBody.__name__)}}
    return {status: {"description": response["description"], "content": body} for status, response in responses.items()}


def _events(stream: SteerStream) -> Iterator[tuple[str, Any]]:
    """The stream's events; closing them closes the generation (and frees the model) at once."""
    with closing(iter(stream)) as steps:
        yield from (("token", tokens) for tokens in steps)
    yield "done", stream.result.to_dict()


@router.post("/steer/stream", summary="Generate without and with feature edits, streamed token by token",
             tags=["interventions"], response_class=EventStream, status_code=200,
             responses={**json_errors(STEER_ERRORS),
                        200: {"description": STREAM_EVENTS, "content": {MEDIA_TYPE: {"schema": STEER_EVENT}}}})
async def post_steer_stream(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep,
                            body: SteerRequest) -> EventStream:
    require_interventions(settings)
    stream = await asyncio.get_running_loop().run_in_executor(queue, lambda: atlas.steer_stream(
        body.text, body.edits, max_new_tokens=body.max_new_tokens, temperature=body.temperature, seed=body.seed))
    return event_stream(queue, _events(stream), atlas.root)
