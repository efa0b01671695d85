"""The FastAPI application: `create_app(settings)`, the `app_from_env` factory that
`uvicorn --workers N` calls in each worker process, and `serve(...)`.

Each worker opens one `Atlas` and preloads it (summary tables, maps, search indexes and
neighbour tables), so they are loaded once per worker and shared by its requests. The
explorer (`api/static/`) is served at `/`. When a token is set, everything needs it except
a bare liveness answer from `/health` (`api.http.routers.service`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import faiss
import torch
from fastapi import Depends, FastAPI

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http.deps import require_token
from sae_atlas.api.http.errors import install_error_handlers
from sae_atlas.api.http.guards import BodyLimit
from sae_atlas.api.http.openapi import atlas_openapi
from sae_atlas.api.http.routers import DATA_ROUTERS, SERVICE_ROUTER
from sae_atlas.api.http.settings import ServerSettings
from sae_atlas.api.http.workers import run_workers

log = logging.getLogger("sae_atlas.http")


def create_app(settings: ServerSettings) -> FastAPI:
    """The application over the atlas at `settings.root` (NotFoundError if not an atlas)."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
        faiss.omp_set_num_threads(settings.threads)
    atlas = Atlas(settings.root)
    atlas.preload()  # before the first request, in every worker
    for sae_id, problem in atlas.damaged().items():  # served without it; /health and /saes say so
        log.error("SAE %s is damaged and not served: %s", sae_id, problem)
    app = FastAPI(
        title="sae-atlas",
        version="1",
        description="Feature search and geometry over sparse autoencoders of a transformer's residual stream.",
        docs_url=None,  # Swagger UI loads from a CDN; the explorer and /openapi.json are local
        redoc_url=None,
        openapi_url=None,  # served by the service router, behind the token
    )
    app.state.atlas = atlas
    app.openapi = lambda: atlas_openapi(app, atlas)  # type: ignore[method-assign]
    app.state.settings = settings
    app.state.model_queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
    install_error_handlers(app, [route for router in (SERVICE_ROUTER, *DATA_ROUTERS) for route in router.routes])
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.include_router(SERVICE_ROUTER)
    for router in DATA_ROUTERS:
        app.include_router(router, dependencies=[Depends(require_token)])
    return app


def app_from_env() -> FastAPI:
    """Application factory for uvicorn workers (settings from `SAE_ATLAS_*` variables)."""
    return create_app(ServerSettings.from_env())


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts local connections."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(settings: ServerSettings, *, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
          log_level: str = "info") -> None:
    """Run the service with uvicorn (blocks), requests it cannot parse answered as JSON
    (`api.http.protocol`). Several workers listen on the port with
    SO_REUSEPORT (`api.http.workers`), each with its own Atlas; settings reach them through
    the environment. Without `settings.threads`,
    each worker gets an equal share of the cores for torch, FAISS and polars, so that
    workers do not oversubscribe them."""
    import uvicorn

    from sae_atlas.api.http.protocol import JsonErrorsProtocol

    if not settings.threads:
        settings = replace(settings, threads=max(1, (os.cpu_count() or 1) // workers))
    os.environ.setdefault("POLARS_MAX_THREADS", str(settings.threads))  # read when a worker imports polars
    Atlas(settings.root)  # fail early, in the parent, if the directory is not an atlas
    if not is_loopback(host) and not settings.token:
        log.warning("serving %s on %s without a token: anyone who can reach it can read the atlas",
                    settings.root, host)
    os.environ.update(settings.to_env())
    if workers > 1:
        run_workers(host=host, port=port, workers=workers, log_level=log_level)
        return
    uvicorn.run("sae_atlas.api.http.app:app_from_env", factory=True, host=host, port=port, log_level=log_level,
                http=JsonErrorsProtocol)
