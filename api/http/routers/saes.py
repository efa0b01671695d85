"""The HTTP layer of `saes`; its other layers: `sae_atlas.api.services.saes` (service).

`/saes`: the SAEs of the atlas and their 2-D maps."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, SaeId, error_responses
from sae_atlas.api.operations.pages import MapParams
from sae_atlas.api.results.feature_map import MapColumns, map_columns
from sae_atlas.api.results.sae import SaeInfo, SaeStatus

router = APIRouter(responses=DATA_ERRORS)
ONE_SAE = error_responses(400, 404)


@router.get("/saes", tags=["saes"], summary="The SAEs of the atlas (damaged ones marked)", response_model=list[SaeStatus])
async def list_saes(atlas: AtlasDep) -> Response:
    return json_body([atlas.sae_status(s) for s in atlas.sae_ids])


@router.get("/saes/{sae_id}", tags=["saes"], summary="One SAE", response_model=SaeInfo, responses=ONE_SAE)
async def get_sae(atlas: AtlasDep, sae_id: str = SaeId) -> Response:
    return json_body(atlas.sae_info(sae_id))


@router.get("/saes/{sae_id}/map", tags=["geometry"], summary="2-D feature map (columns)",
            response_model=MapColumns, responses=ONE_SAE)
async def get_map(atlas: AtlasDep, params: Annotated[MapParams, Query()], sae_id: str = SaeId) -> Response:
    return json_body(map_columns(params.basis, atlas.map_scores(sae_id), atlas.map(sae_id, params.basis)))
