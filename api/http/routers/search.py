"""The HTTP layer of `search`; its other layers: `sae_atlas.api.commands.search` (CLI),
`sae_atlas.api.operations.search` (parameter), `sae_atlas.api.results.search` (typed-result),
`sae_atlas.api.services.search` (service), `sae_atlas.store.search` (persistence).

Searches: decoder neighbours, cross-layer flow, nearest to a vector, by text and by token.

Lookups over loaded indexes are `async` handlers on the event loop; text search runs the
model on the worker's one-thread model queue."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from sae_atlas.api.bounds import MAX_INDEX
from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, Index, SaeId, error_responses
from sae_atlas.api.http.schemas import TextQuery, VectorQuery
from sae_atlas.api.http.schemas_meaning import ContrastQuery
from sae_atlas.api.operations.search import (
    FlowParams,
    SimilarParams,
    TokenSearchOptions,
    TokenSearchParams,
)
from sae_atlas.api.results.feature import Match
from sae_atlas.api.results.meaning import ContrastResult
from sae_atlas.api.results.search import TextSearch, TokenFeatures

router = APIRouter(tags=["search"], responses={**DATA_ERRORS, **error_responses(400, 404)})
POSTED = error_responses(413)


@router.get("/saes/{sae_id}/features/{index}/similar", summary="Nearest decoder directions",
            response_model=list[Match])
async def get_similar(atlas: AtlasDep, params: Annotated[SimilarParams, Query()], sae_id: str = SaeId,
                      index: int = Index) -> Response:
    return json_body(atlas.similar(sae_id, index, **params.model_dump()).to_dicts())


@router.get("/saes/{sae_id}/features/{index}/flow", summary="Cross-layer matches", response_model=list[Match])
async def get_flow(atlas: AtlasDep, params: Annotated[FlowParams, Query()], sae_id: str = SaeId,
                   index: int = Index) -> Response:
    return json_body(atlas.flow(sae_id, index, **params.model_dump()).to_dicts())


@router.post("/search/vector", summary="Features nearest to a direction", response_model=list[Match],
             responses=POSTED)
async def search_vector(atlas: AtlasDep, query: VectorQuery) -> Response:
    return json_body(atlas.search_vector(**query.model_dump()).to_dicts())


@router.post("/search/text", summary="Features firing on each token of a text", response_model=TextSearch,
             responses=POSTED)
async def search_text(atlas: AtlasDep, queue: ModelQueueDep, query: TextQuery) -> Response:
    result = await asyncio.get_running_loop().run_in_executor(queue, lambda: atlas.search_text(**dict(query)))
    return json_body(result)


@router.post("/search/contrast", summary="Features separating two sets of texts", response_model=ContrastResult,
             responses=POSTED)
async def search_contrast(atlas: AtlasDep, queue: ModelQueueDep, query: ContrastQuery) -> Response:
    result = await asyncio.get_running_loop().run_in_executor(queue, lambda: atlas.contrast(**dict(query)))
    return json_body(result.to_dict())


@router.get("/search/token", summary="Features centred on / promoting a token string", response_model=TokenFeatures)
def search_token(atlas: AtlasDep, params: Annotated[TokenSearchParams, Query()]) -> Response:
    return json_body(atlas.search_token(**params.model_dump()).to_dict())


@router.get("/search/token/{token_id}", summary="Features centred on / promoting a token id",
            response_model=TokenFeatures)
def search_token_id(atlas: AtlasDep, params: Annotated[TokenSearchOptions, Query()],
                    token_id: int = Path(ge=0, le=MAX_INDEX, description="token id")) -> Response:
    return json_body(atlas.search_token(token_id, **params.model_dump()).to_dict())


