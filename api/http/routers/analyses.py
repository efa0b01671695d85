"""The HTTP layer of `analyses`; its other layers: `sae_atlas.api.operations.analyses` (parameter),
`sae_atlas.api.services.analyses` (service).

`/analyses`: stored geometry results, their figures, and (with `--allow-analyses`) new runs.

Analyses are plain functions run in the server's thread pool."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, Response

from sae_atlas.api.http.deps import AtlasDep, SettingsDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, FigureName, Kind, Run, error_responses
from sae_atlas.api.http.schemas import CircularRequest
from sae_atlas.api.results.analysis import AnalysisResult, AnalysisRunFiles
from sae_atlas.store.layout import check_id

router = APIRouter(tags=["geometry"], responses=DATA_ERRORS)
LOOKUP = error_responses(400, 404)


@router.get("/analyses", summary="Stored geometry results", response_model=list[AnalysisRunFiles])
async def list_analyses(atlas: AtlasDep) -> Response:
    return json_body(atlas.analyses().to_dicts())


@router.get("/analyses/{kind}/{run}", summary="One geometry result", response_model=AnalysisResult, responses=LOOKUP)
def get_analysis(atlas: AtlasDep, kind: str = Kind, run: str = Run) -> Response:
    return json_body(atlas.analysis(check_id(kind, "analysis kind"), check_id(run, "run name")).to_dict())


@router.get("/analyses/{kind}/figures/{name}", summary="A stored figure (PNG)", response_class=FileResponse,
            responses={200: {"content": {"image/png": {}}, "description": "the PNG"}, **LOOKUP})
def get_figure(atlas: AtlasDep, kind: str = Kind, name: str = FigureName) -> FileResponse:
    return FileResponse(atlas.figure_path(check_id(kind, "analysis kind"), name), media_type="image/png")


@router.post("/analyses/circular",
             summary="Run circular-feature discovery on one SAE (server started with --allow-analyses)",
             response_model=AnalysisResult, responses={**LOOKUP, **error_responses(403, 413)})
def run_circular(atlas: AtlasDep, settings: SettingsDep, body: CircularRequest) -> Response:
    if not settings.allow_analyses:
        raise HTTPException(status_code=403, detail="this server is read-only; start it with --allow-analyses")
    return json_body(atlas.run_circular(**dict(body)).to_dict())
