"""The HTTP layer of `meaning`; its other layers: `sae_atlas.api.results.meaning` (typed-result),
`sae_atlas.api.services.meaning` (service).

Searches by meaning: `/search/concept` (which features carry a concept and which few
span it; runs the model on the concept's prompts, on the worker's one-thread model queue),
`/search/geometry` (features by the geometry results they belong to) and `/search/labels`
(features whose labels or explanations match words)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, error_responses
from sae_atlas.api.http.schemas_meaning import ConceptQuery
from sae_atlas.api.operations.search import GeometrySearchParams, LabelSearchParams
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
async def search_geometry(atlas: AtlasDep, params: Annotated[GeometrySearchParams, Query()]) -> Response:
    return json_body(atlas.geometry_features(**params.model_dump()).to_dicts())


@router.get("/search/labels", summary="Features whose labels or explanations match words", response_model=list[LabelHit])
async def search_labels(atlas: AtlasDep, params: Annotated[LabelSearchParams, Query()]) -> Response:
    return json_body(atlas.search_labels(**params.model_dump()).to_dicts())
