"""The HTTP layer of `steering`; its other layers: `sae_atlas.api.operations.steering` (parameter),
`sae_atlas.api.results.steering` (typed-result), `sae_atlas.api.services.steering` (service),
`sae_atlas.store.steering` (persistence).

Steering that a user can aim: `GET/POST /steering/search` and `POST /steer/stream`.

`/steering/search` ranks the SAEs' features by their measured effect toward a target (a
token; in the body also several tokens, a concept or a contrast of two text sets), each
with a calibrated strength and a ready edit (`Atlas.steering_features`; its parameters are
`api.operations.steering.SteeringSearchParams`: the body takes them all, the query all but
the target, a token there, and a category of your own). It steers the model
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
from pydantic import ConfigDict, Field, model_validator

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep, SettingsDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.interventions import (
    MODEL_BOUND,
    SteerRequest,
    require_interventions,
)
from sae_atlas.api.http.routers.params import DATA_ERRORS, error_responses
from sae_atlas.api.http.schemas import ErrorBody, JsonInt, json_strict
from sae_atlas.api.http.schemas_meaning import ConceptSpec
from sae_atlas.api.http.sse import (
    MEDIA_TYPE,
    EventStream,
    component,
    data_schema,
    event_schema,
    event_stream,
)
from sae_atlas.api.operations.steering import (
    BuiltinCategory,
    SteeringConcept,
    SteeringContrast,
    SteeringOptions,
    SteeringSearchParams,
    SteeringTokens,
    Token,
    TokenText,
    UserPrompt,
)
from sae_atlas.api.results.interventions import SteerView
from sae_atlas.api.results.steer_stream import SteerTokens
from sae_atlas.api.results.steering import SteeringSearch
from sae_atlas.api.services.steer_stream import SteerStream

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
router = APIRouter()


class SteeringConceptQuery(SteeringConcept):
    """Raise a concept's values as next tokens (a built-in concept or one given inline, never
    a file of the server)."""

    concept: Literal["weekdays", "months", "colours"] | ConceptSpec = Field(
        description="a built-in concept name or a concept of your own")


HttpTarget = json_strict(Token | list[Token] | Annotated[SteeringTokens | SteeringConceptQuery | SteeringContrast,
                                                         Field(discriminator="kind")])


class _HttpBounds(SteeringOptions):
    """What HTTP bounds more tightly than Python, so that one request stays cheap."""

    n_prompts: JsonInt = Field(default=SteeringOptions.default("n_prompts"), ge=1, le=MAX_HTTP_STEERING_PROMPTS,
                               description="held-out ranking prompts")
    candidates: JsonInt = Field(default=SteeringOptions.default("candidates"), ge=1,
                                le=MAX_HTTP_STEERING_CANDIDATES, description="candidates measured per SAE")
    confirm_prompts: JsonInt = Field(default=SteeringOptions.default("confirm_prompts"), ge=0,
                                     le=MAX_HTTP_STEERING_PROMPTS, json_schema_extra={"not": {"const": 1}},
                                     description="held-out neutral prompts the ranking is confirmed on (0, or 2 "
                                                 "or more)")
    prompts: list[UserPrompt] = Field(default_factory=list, max_length=MAX_HTTP_USER_PROMPTS,
                                      description="your own prompts (style user): half rank, half confirm")
    combine: JsonInt = Field(default=SteeringOptions.default("combine"), ge=0, le=MAX_HTTP_COMBINE,
                             description="features in the fitted sparse combination (0: none)")


class SteeringQuery(_HttpBounds, SteeringSearchParams):
    """Features ranked by their measured effect toward a target, with calibrated strengths
    (`api.operations.steering.SteeringSearchParams`, within the HTTP bounds; the old field
    name `sae_ids` is still accepted)."""

    target: HttpTarget = Field(description="a token, several tokens, or a target of several tokens, a concept or "
                                           "a contrast")


class SteeringGetQuery(_HttpBounds):
    """`GET /steering/search`'s query: a token target and `SteeringQuery`'s options but a
    category of your own (`sae_id`: the old name of `saes`)."""

    model_config = ConfigDict(extra="forbid", strict=False)  # query values are text
    renamed = {"sae_ids": "saes", "sae_id": "saes"}

    token: TokenText
    category: BuiltinCategory | None = Field(default=None, description="the target's class for in-context prompts "
                                                                       "and siblings (default: the built-in one "
                                                                       "listing the token)")

    @model_validator(mode="before")
    @classmethod
    def _one_sae(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {**data, **{k: [v] for k in ("sae_id", "saes") if isinstance(v := data.get(k), str)}}
        return data


async def _search(atlas: Atlas, queue: Executor, target: Any, options: dict[str, Any]) -> Response:
    result = await asyncio.get_running_loop().run_in_executor(
        queue, lambda: atlas.steering_features(target, **options))
    return json_body(result.to_dict())


@router.get("/steering/search", summary="Features that raise a token, ranked by measured steering effect",
            tags=["steering"], response_model=SteeringSearch, responses={**STEER_ERRORS, **SEARCH_BOUND})
async def get_steering_search(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep,
                              query: Annotated[SteeringGetQuery, Query()]) -> Response:
    require_interventions(settings)
    return await _search(atlas, queue, query.token, query.model_dump(exclude={"token"}))


@router.post("/steering/search", summary="Features that move the model toward a target, ranked by measured effect",
             tags=["steering"], response_model=SteeringSearch, responses={**STEER_ERRORS, **SEARCH_BOUND})
async def post_steering_search(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep,
                               body: SteeringQuery) -> Response:
    require_interventions(settings)
    return await _search(atlas, queue, body.model_dump()["target"], body.model_dump(exclude={"target"}))


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
    stream = await asyncio.get_running_loop().run_in_executor(queue, lambda: atlas.steer_stream(**body.model_dump()))
    return event_stream(queue, _events(stream), atlas.root)
