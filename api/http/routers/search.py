"""Searches: decoder neighbours, cross-layer flow, nearest to a vector, by text and by token.

Lookups over loaded indexes are `async` handlers on the event loop; text search runs the
model on the worker's one-thread model queue."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from sae_atlas.api.bounds import MAX_INDEX, MAX_K
from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, Index, K, OneSae, SaeId, error_responses
from sae_atlas.api.http.schemas import TextQuery, VectorQuery
from sae_atlas.api.http.schemas_meaning import ContrastQuery
from sae_atlas.api.results.feature import Match
from sae_atlas.api.results.meaning import ContrastResult
from sae_atlas.api.results.search import TextSearch, TokenFeatures

router = APIRouter(tags=["search"], responses={**DATA_ERRORS, **error_responses(400, 404)})
POSTED = error_responses(413)


@router.get("/saes/{sae_id}/features/{index}/similar", summary="Nearest decoder directions",
            response_model=list[Match])
async def get_similar(atlas: AtlasDep, sae_id: str = SaeId, index: int = Index, k: int = K) -> Response:
    return json_body(atlas.similar(sae_id, index, k=k).to_dicts())


@router.get("/saes/{sae_id}/features/{index}/flow", summary="Cross-layer matches", response_model=list[Match])
async def get_flow(atlas: AtlasDep, sae_id: str = SaeId, index: int = Index,
                   k: int = Query(5, ge=1, le=MAX_K)) -> Response:
    return json_body(atlas.flow(sae_id, index, k=k).to_dicts())


@router.post("/search/vector", summary="Features nearest to a direction", response_model=list[Match],
             responses=POSTED)
async def search_vector(atlas: AtlasDep, query: VectorQuery) -> Response:
    return json_body(atlas.search_vector(query.vector, sae_id=query.sae_id, k=query.k).to_dicts())


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
def search_token(
    atlas: AtlasDep,
    token: str = Query(min_length=1, max_length=256, description="token string, as the tokenizer writes it"),
    sae_id: str | None = OneSae,
    k: int = K,
) -> Response:
    return json_body(atlas.search_token(token, sae_id=sae_id or None, k=k).to_dict())


@router.get("/search/token/{token_id}", summary="Features centred on / promoting a token id",
            response_model=TokenFeatures)
def search_token_id(
    atlas: AtlasDep,
    token_id: int = Path(ge=0, le=MAX_INDEX, description="token id"),
    sae_id: str | None = OneSae,
    k: int = K,
) -> Response:
    return json_body(atlas.search_token(token_id, sae_id=sae_id or None, k=k).to_dict())


