"""FastAPI dependencies shared by the routers: the worker's `Atlas`, its settings, the
bearer-token guard and the one-thread model queue. `create_app` puts them on `app.state`."""

from __future__ import annotations

import hmac
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http.settings import ServerSettings


def get_atlas(request: Request) -> Atlas:
    """The worker's Atlas (opened and preloaded once by `create_app`)."""
    return request.app.state.atlas


def get_settings(request: Request) -> ServerSettings:
    """The settings the server was started with."""
    return request.app.state.settings


def get_model_queue(request: Request) -> ThreadPoolExecutor:
    """The worker's one-thread queue for model runs (first come, first served)."""
    return request.app.state.model_queue


TOKEN_COOKIE = "sae_atlas_token"


def token_ok(request: Request, offered: str | None = None) -> bool:
    """Whether `request` may read data: always without a server token; with one, when it
    sends `Authorization: Bearer <token>`, the explorer's cookie, or `offered` (the
    explorer's `?token=`) matches."""
    token = get_settings(request).token
    if not token:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    candidates = [given.strip() if scheme.lower() == "bearer" else None, request.cookies.get(TOKEN_COOKIE), offered]
    return any(c is not None and hmac.compare_digest(c.encode(), token.encode()) for c in candidates)


def require_token(request: Request) -> None:
    """401 unless the request carries the server's bearer token (when one is set)."""
    if not token_ok(request):
        raise unauthorized()


def unauthorized() -> HTTPException:
    """The 401 answer to a request without the server's token."""
    return HTTPException(
        status_code=401,
        detail="missing or wrong bearer token: send 'Authorization: Bearer <token>' "
               "(the explorer: open /?token=<token>)",
        headers={"WWW-Authenticate": "Bearer"},
    )


AtlasDep = Annotated[Atlas, Depends(get_atlas)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
ModelQueueDep = Annotated[ThreadPoolExecutor, Depends(get_model_queue)]
