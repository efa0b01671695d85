"""Every error as a JSON body `{"error": <kind>, "detail": <what was wrong>}`.

AtlasError subclasses carry their status (NotFoundError 404, InvalidInputError 400,
IntegrityError 500 with the atlas-relative file and the repair command); request validation failures are
422 listing each bad field; unknown routes 404; anything unexpected a 500 without a trace.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from store.errors import AtlasError, IntegrityError

log = logging.getLogger("sae_atlas.http")


def error_response(status: int, kind: str, detail: str, **extra: Any) -> JSONResponse:
    """A JSON error response."""
    return JSONResponse(status_code=status, content={"error": kind, "detail": detail, **extra})


def error_bytes(kind: str, detail: str) -> bytes:
    """An error body as bytes, for answers written below the application (ASGI middleware,
    the HTTP protocol)."""
    return json.dumps({"error": kind, "detail": detail}).encode()


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part not in ("body",)) or "body"


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn exceptions into JSON error bodies."""

    @app.exception_handler(AtlasError)
    async def atlas_error(request: Request, exc: AtlasError) -> JSONResponse:
        if isinstance(exc, IntegrityError):
            log.error("integrity error: %s", exc)
            root = request.app.state.atlas.root
            return error_response(500, "integrity", exc.describe(root), path=exc.relative_path(root),
                                  repair=exc.repair)
        return error_response(exc.http_status, type(exc).__name__, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{_field(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()]
        return error_response(422, "validation", "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such endpoint {request.url.path!r}; see /openapi.json"
        return JSONResponse(status_code=exc.status_code, content={"error": "http", "detail": detail},
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(500, "internal", f"internal error ({type(exc).__name__}); see the server log")
