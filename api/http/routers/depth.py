"""The HTTP layer of `depth`; its other layers: `sae_atlas.api.analyses.depth` (analysis-run),
`sae_atlas.api.operations.depth` (parameter), `sae_atlas.api.results.depth` (typed-result),
`sae_atlas.api.services.depth` (service).

`/depth`: stored depth runs (read-only; `sae-atlas analyze depth` writes them under
`analyses/depth/`, which `GET /analyses/depth/<run>` also serves as a generic result)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, Run, error_responses
from sae_atlas.api.results.depth import DepthRun, DepthRunRow

router = APIRouter(tags=["depth"], responses=DATA_ERRORS)


@router.get("/depth", summary="Stored depth runs with their headline and status", response_model=list[DepthRunRow])
def list_depth_runs(atlas: AtlasDep) -> Response:
    return json_body(atlas.depth_runs())


@router.get("/depth/{run}", response_model=DepthRun, responses=error_responses(400, 404),
            summary="One depth run: ID and local ID against depth with intervals, CKA between layers, logit and "
                    "tuned lenses, trajectory distributions and extremes, joined features, or per-family metrics")
def get_depth_run(atlas: AtlasDep, run: str = Run) -> Response:
    return json_body(atlas.depth_run(run).to_dict())
