"""The HTTP layer of `errors`; its other layers: `sae_atlas.errors` (core).

Every error as a JSON body `{"error": <kind>, "detail": <what was wrong>}`.

AtlasError subclasses carry their status (NotFoundError 404, InvalidInputError 400,
IntegrityError 500 with the atlas-relative file and the repair command), their details naming files
relative to the atlas and never the server's paths; request validation failures are
422 listing each bad field; unknown routes 404; a method the path does not serve 405 with `Allow` naming
every method served there; anything unexpected a 500 without a trace.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Route

from sae_atlas.errors import AtlasError, IntegrityError, without_root

log = logging.getLogger("sae_atlas.http")


def error_response(status: int, kind: str, detail: str, **extra: Any) -> JSONResponse:
    """A JSON error response."""
    return JSONResponse(status_code=status, content={"error": kind, "detail": detail, **extra})


def atlas_error_body(exc: AtlasError, root: Path) -> dict[str, Any]:
    """The JSON body of an error raised on purpose, with the atlas's location left out
    (`sae_atlas.errors.without_root`): files named relative to the atlas at `root`, `<atlas>` for
    it in repair commands; an IntegrityError also gives the file and the repair apart."""
    if isinstance(exc, IntegrityError):
        return {"error": "integrity", "detail": exc.describe(root), "path": exc.relative_path(root),
                "repair": without_root(exc.repair, root)}
    return {"error": type(exc).__name__, "detail": without_root(str(exc), root)}


def error_bytes(kind: str, detail: str) -> bytes:
    """An error body as bytes, for answers written below the application (ASGI middleware,
    the HTTP protocol)."""
    return json.dumps({"error": kind, "detail": detail}).encode()


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part not in ("body",)) or "body"


def allowed_methods(routes: Sequence[BaseRoute], path: str) -> str:
    """The `Allow` value for `path`: the methods of every route whose template matches it
    (Starlette names only the first such route's, so a path served by a GET and a POST route
    would seem to serve one)."""
    methods = {method for route in routes if isinstance(route, Route) and route.path_regex.match(path)
               for method in route.methods or ()}
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI, routes: Sequence[BaseRoute]) -> None:
    """Register the handlers that turn exceptions into JSON error bodies (`routes`: those the
    app serves, for the `Allow` of a 405)."""

    @app.exception_handler(AtlasError)
    async def atlas_error(request: Request, exc: AtlasError) -> JSONResponse:
        if isinstance(exc, IntegrityError):
            log.error("integrity error: %s", exc)
        return JSONResponse(status_code=exc.http_status, content=atlas_error_body(exc, request.app.state.atlas.root))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{_field(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()]
        return error_response(422, "validation", "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such endpoint {request.url.path!r}; see /openapi.json"
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(routes, request.scope["path"])}
        return JSONResponse(status_code=exc.status_code, content={"error": "http", "detail": detail},
                            headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(500, "internal", f"internal error ({type(exc).__name__}); see the server log")
