"""`/compare`: stored comparisons of two SAEs (read-only; `sae-atlas compare` writes them)."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import Response

from api.http.deps import AtlasDep
from api.http.json_body import json_body
from api.http.routers.params import DATA_ERRORS, Comparison, error_responses
from api.results.compare import MAX_PAIRS, CompareResult, CompareRunRow
from store.layout import check_id

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
