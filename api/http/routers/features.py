"""The HTTP layer of `features`; its other layers: `sae_atlas.api.services.features` (service).

`/saes/{sae_id}/features`: the per-latent table, feature pages and stored examples."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response

from sae_atlas.api.bounds import MAX_INDEX, MAX_LIST
from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, Index, SaeId, error_responses
from sae_atlas.api.http.schemas import FeaturePage
from sae_atlas.api.operations.pages import ExamplesParams, FeaturePageParams
from sae_atlas.api.results.feature import Feature, StoredExample
from sae_atlas.api.services.features import table_page

router = APIRouter(tags=["features"], responses={**DATA_ERRORS, **error_responses(400, 404)})
SortKey = Literal["latent", "density", "max_act", "mean_active_act"]


def _wants_html(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "text/html" in accept and "application/json" not in accept


@router.get("/saes/{sae_id}/features", summary="A page of the per-latent table", response_model=FeaturePage)
async def list_features(
    atlas: AtlasDep,
    sae_id: str = SaeId,
    offset: int = Query(0, ge=0, le=MAX_INDEX),
    limit: int = Query(100, ge=1, le=MAX_LIST),
    sort: SortKey = Query("latent", description="largest first, except `latent`"),
) -> Response:
    total, rows = table_page(atlas.sae(sae_id), offset=offset, limit=limit, sort=sort)
    return json_body({"total": total, "offset": offset, "rows": rows.to_dicts()})


@router.get("/saes/{sae_id}/features/{index}", response_model=Feature,
            summary="Feature page: stats, histogram, examples, logits, neighbours, map",
            responses={307: {"description": "a browser (Accept: text/html) is sent to the explorer's page"}})
async def get_feature(
    request: Request,
    atlas: AtlasDep,
    params: Annotated[FeaturePageParams, Query()],
    sae_id: str = SaeId,
    index: int = Index,
) -> Response:
    if _wants_html(request):  # a browser following a feature link gets the explorer
        return RedirectResponse(f"/#/saes/{sae_id}/features/{index}", status_code=307)
    return json_body(atlas.feature(sae_id, index, **params.model_dump()))


@router.get("/saes/{sae_id}/features/{index}/examples", summary="All stored examples",
            response_model=list[StoredExample])
async def get_examples(
    atlas: AtlasDep, params: Annotated[ExamplesParams, Query()], sae_id: str = SaeId, index: int = Index,
) -> Response:
    return json_body(atlas.examples(sae_id, index, **params.model_dump()).to_dicts())
