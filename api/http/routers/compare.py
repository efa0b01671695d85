"""The HTTP layer of `compare`; its other layers: `sae_atlas.api.commands.compare` (CLI),
`sae_atlas.api.operations.compare` (parameter), `sae_atlas.api.results.compare` (typed-result),
`sae_atlas.api.services.compare` (service).

`/compare`: stored comparisons of two SAEs (read-only; `sae-atlas compare` writes them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, Comparison, Index, error_responses
from sae_atlas.api.operations.pages import FeaturePageParams
from sae_atlas.api.results.compare import MAX_PAIRS, CompareResult, CompareRunRow, Side
from sae_atlas.api.results.feature import Feature
from sae_atlas.store.layout import check_id

router = APIRouter(tags=["compare"], responses=DATA_ERRORS)


@router.get("/compare", summary="Stored comparisons of two SAEs", response_model=list[CompareRunRow])
def list_comparisons(atlas: AtlasDep) -> Response:
    return json_body(atlas.comparisons())


@router.get("/compare/{comparison}", summary="One stored comparison: scores beside their nulls, matched pairs",
            response_model=CompareResult, responses=error_responses(400, 404))
def get_comparison(atlas: AtlasDep, comparison: str = Comparison,
                   pairs: int = Query(100, ge=0, le=MAX_PAIRS, description="matched pairs to send, best first")
                   ) -> Response:
    return json_body(atlas.comparison(check_id(comparison, "run name")).to_dict(max_rows=pairs))


@router.get("/compare/{comparison}/{side}/features/{index}", response_model=Feature,
            summary="Feature page of one side's latent, read from the atlas that side belongs to",
            responses=error_responses(400, 404))
def get_side_feature(atlas: AtlasDep, side: Side, params: Annotated[FeaturePageParams, Query()],
                     comparison: str = Comparison, index: int = Index) -> Response:
    return json_body(atlas.compared_feature(comparison, side, index, **params.model_dump()))
