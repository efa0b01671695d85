"""The HTTP endpoints as module-level routers, each a thin wrapper over the worker's `Atlas`
(`api.http.deps.get_atlas`). `DATA_ROUTERS` sit behind the bearer token; a new endpoint
family adds its module here."""

from __future__ import annotations

from fastapi import APIRouter

from sae_atlas.api.http.routers import (
                                 analyses,
                                 board,
                                 compare,
                                 crosscoders,
                                 depth,
                                 evals,
                                 features,
                                 graph,
                                 interventions,
                                 meaning,
                                 saes,
                                 search,
                                 service,
                                 steering,
)

DATA_ROUTERS: list[APIRouter] = [saes.router, features.router, search.router, meaning.router, analyses.router,
                                 interventions.router, steering.router, board.router, evals.router,
                                 compare.router, crosscoders.router, graph.router, depth.router]
SERVICE_ROUTER = service.router
