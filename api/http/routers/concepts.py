"""`/search/concept`: which features carry a concept and which few span it (runs the model
on the concept's prompts, on the worker's one-thread model queue)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response

from api.http.deps import AtlasDep, ModelQueueDep, sae_id_checked
from api.http.json_body import json_body
from api.http.routers.params import DATA_ERRORS, error_responses
from api.http.schemas_meaning import ConceptQuery, ConceptSearchResult

router = APIRouter(tags=["search"], responses={**DATA_ERRORS, **error_responses(400, 404, 413)})


@router.post("/search/concept", summary="Features carrying a concept, its span and geometry",
             response_model=ConceptSearchResult)
async def search_concept(atlas: AtlasDep, queue: ModelQueueDep, query: ConceptQuery) -> Response:
    ids = [sae_id_checked(s) for s in query.sae_ids] if query.sae_ids else None
    concept = query.concept if isinstance(query.concept, str) else query.concept.model_dump()
    options = query.model_dump(exclude={"concept", "sae_ids"})
    result = await asyncio.get_running_loop().run_in_executor(
        queue, lambda: atlas.concept_search(concept, saes=ids, **options))
    return json_body(result.to_dict())
