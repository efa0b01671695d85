"""The service itself: liveness (`/health`), the OpenAPI document and the explorer (`/`,
`/static/*`). With a server token, everything but a bare `{"status": "ok"}` from `/health`
needs it; a browser opens `/?token=<token>` once, which sets an HttpOnly, same-site cookie."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, Response

from sae_atlas.api.http.deps import (
    TOKEN_COOKIE,
    AtlasDep,
    SettingsDep,
    require_token,
    token_ok,
    unauthorized,
)
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import error_responses
from sae_atlas.api.http.schemas import Health
from sae_atlas.errors import NotFoundError

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}
router = APIRouter()
Guarded = Annotated[None, Depends(require_token)]


@router.get("/health", tags=["service"], summary="Liveness (and, with the token, what is served)",
            response_model=Health, response_model_exclude_none=True)
def health(request: Request, atlas: AtlasDep, settings: SettingsDep) -> Health:
    if not token_ok(request):
        return Health(status="ok")
    damaged = atlas.damaged()
    saes = {r["sae_id"]: r["problem"] for r in atlas.saes().to_dicts() if r["status"] == "unregistered"}
    runs = {f"{r['kind']}/{r['run']}": r["problem"] for r in atlas.analyses().to_dicts() if r["status"] == "unregistered"}
    return Health(status="ok", saes=len(atlas.sae_ids) - len(damaged), worker_pid=os.getpid(),
                  auth=bool(settings.token), analyses_allowed=settings.allow_analyses,
                  interventions_allowed=settings.allow_interventions,
                  damaged_saes=damaged or None, unregistered_saes=saes or None, unregistered_analyses=runs or None)


@router.get("/openapi.json", include_in_schema=False, responses=error_responses(401))
def openapi(request: Request, _: Guarded) -> Response:
    return json_body(request.app.openapi())


@router.get("/", include_in_schema=False)
def explorer(request: Request, settings: SettingsDep,
             token: str | None = Query(None, max_length=4096)) -> FileResponse:
    if not token_ok(request, offered=token):
        raise unauthorized()
    page = FileResponse(STATIC_DIR / "index.html", media_type="text/html")
    if token is not None and settings.token:  # `/?token=...`: the page's files and links send it as a cookie
        page.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return page


@router.get("/static/{name}", include_in_schema=False)
def static_file(name: str, _: Guarded) -> FileResponse:
    path = STATIC_DIR / name
    if path.suffix not in MEDIA_TYPES or path.parent != STATIC_DIR or not path.is_file():
        raise NotFoundError(f"no explorer file {name!r}")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix])
