"""Searches by meaning: `/search/concept` (which features carry a concept and which few
span it; runs the model on the concept's prompts, on the worker's one-thread model queue),
`/search/geometry` (features by the geometry results they belong to) and `/search/labels`
(features whose labels or explanations match words)."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, K, OneSae, error_responses
from sae_atlas.api.http.schemas_meaning import ConceptQuery
from sae_atlas.api.results.meaning import ConceptResult, GeometryFeature, LabelHit

router = APIRouter(tags=["search"], responses={**DATA_ERRORS, **error_responses(400, 404, 413)})


@router.post("/search/concept", summary="Features carrying a concept, its span and geometry",
             response_model=ConceptResult)
async def search_concept(atlas: AtlasDep, queue: ModelQueueDep, query: ConceptQuery) -> Response:
    concept = query.concept if isinstance(query.concept, str) else query.concept.model_dump()
    result = await asyncio.get_running_loop().run_in_executor(
        queue, lambda: atlas.concept_search(**{**dict(query), "concept": concept}))
    return json_body(result.to_dict())


@router.get("/search/geometry", summary="Features in a circle, of a period, in a lobe", response_model=list[GeometryFeature])
async def search_geometry(
    atlas: AtlasDep,
    sae_id: str | None = OneSae,
    in_circle: bool | None = Query(None, description="in a circle (true) or in none (false)"),
    period: float | None = Query(None, gt=0, le=100_000, description="fitted period of the circle (within 0.5)"),
    lobe: int | None = Query(None, ge=0, le=2**31 - 1, description="co-occurrence lobe"),
    kind: Literal["circle", "concept", "hierarchy", "lobe"] | None = Query(None),
) -> Response:
    frame = atlas.geometry_features(sae_id or None, in_circle=in_circle, period=period,
                                    lobe=lobe, kind=kind)
    return json_body(frame.to_dicts())


@router.get("/search/labels", summary="Features whose labels or explanations match words", response_model=list[LabelHit])
async def search_labels(
    atlas: AtlasDep,
    q: str = Query(min_length=1, max_length=500, pattern="[A-Za-z0-9]", examples=["weekday"],
               description="words to look for (at least one letter or digit)"),
    sae_id: str | None = OneSae,
    k: int = K,
) -> Response:
    return json_body(atlas.search_labels(q, sae_id=sae_id or None, k=k).to_dicts())
