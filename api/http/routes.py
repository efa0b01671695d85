"""The HTTP endpoints: thin wrappers over one `Atlas` per worker process.

Lookups over loaded tables and indexes (a millisecond or less) are `async` handlers that
run on the event loop; model runs (text search) queue first-come first-served on one
thread per worker, and analyses are plain functions run in the server's thread pool. Bodies are rendered by `json_body` (orjson). Ids are checked with
`store.layout.check_id` before they touch a path, and every limit is declared on the
parameter so it shows in `/openapi.json`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from api.atlas import MAX_EXAMPLES, MAX_K, Atlas
from api.http.json_body import json_body
from api.http.schemas import CircularRequest, TextQuery, VectorQuery
from store.layout import check_id

MAX_INDEX = 2**31 - 1
MAX_LIST = 1000
SaeId = Path(description="SAE id, e.g. blocks.6.hook_resid_post-topk-4608", max_length=128)
Index = Path(ge=0, le=MAX_INDEX, description="latent index")
K = Query(10, ge=1, le=MAX_K, description=f"number of results (1..{MAX_K})")
Kind = Path(max_length=128, description="analysis kind, e.g. circular")


def _rows(frame: pl.DataFrame) -> Response:
    return json_body(frame.to_dicts())


def _sae(sae_id: str) -> str:
    return check_id(sae_id, "SAE id")


def _wants_html(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "text/html" in accept and "application/json" not in accept


def build_router(atlas: Atlas, *, allow_analyses: bool, guard: Any) -> APIRouter:
    """All data endpoints over `atlas`, each behind the bearer-token `guard`."""
    router = APIRouter(dependencies=[Depends(guard)])

    @router.get("/saes", tags=["saes"], summary="The SAEs of the atlas", response_model=list[dict[str, Any]])
    async def list_saes() -> Response:
        return json_body([atlas.sae_info(s) for s in atlas.sae_ids])

    @router.get("/saes/{sae_id}", tags=["saes"], summary="One SAE", response_model=dict[str, Any])
    async def get_sae(sae_id: str = SaeId) -> Response:
        return json_body(atlas.sae_info(_sae(sae_id)))

    @router.get("/saes/{sae_id}/features", tags=["features"], summary="A page of the per-latent table",
                response_model=dict[str, Any])
    async def list_features(
        sae_id: str = SaeId,
        offset: int = Query(0, ge=0, le=MAX_INDEX),
        limit: int = Query(100, ge=1, le=MAX_LIST),
        sort: str = Query("latent", pattern="^(latent|density|max_act|mean_active_act)$"),
    ) -> Response:
        frame = atlas.features(_sae(sae_id)).select(
            "latent", "n_active", "density", "mean_act", "mean_active_act", "max_act")
        if sort != "latent":
            frame = frame.sort(sort, descending=True)
        return json_body({"total": frame.height, "offset": offset, "rows": frame.slice(offset, limit).to_dicts()})

    @router.get("/saes/{sae_id}/features/{index}", tags=["features"], response_model=dict[str, Any],
                summary="Feature page: stats, histogram, examples, logits, neighbours, map")
    async def get_feature(
        request: Request,
        sae_id: str = SaeId,
        index: int = Index,
        examples: int = Query(10, ge=1, le=MAX_EXAMPLES),
        neighbours: int = Query(8, ge=1, le=MAX_K),
    ) -> Response:
        if _wants_html(request):  # a browser following a feature link gets the explorer
            return RedirectResponse(f"/#/saes/{_sae(sae_id)}/features/{index}", status_code=307)
        return json_body(atlas.feature(_sae(sae_id), index, examples=examples, neighbours=neighbours))

    @router.get("/saes/{sae_id}/features/{index}/examples", tags=["features"], summary="All stored examples",
                response_model=list[dict[str, Any]])
    async def get_examples(
        sae_id: str = SaeId, index: int = Index,
        kind: str | None = Query(None, pattern="^(top|band)$"),
    ) -> Response:
        return _rows(atlas.examples(_sae(sae_id), index, kind))

    @router.get("/saes/{sae_id}/features/{index}/similar", tags=["search"], summary="Nearest decoder directions",
                response_model=list[dict[str, Any]])
    async def get_similar(sae_id: str = SaeId, index: int = Index, k: int = K) -> Response:
        return _rows(atlas.similar(_sae(sae_id), index, k=k))

    @router.get("/saes/{sae_id}/features/{index}/flow", tags=["search"], summary="Cross-layer matches",
                response_model=list[dict[str, Any]])
    async def get_flow(sae_id: str = SaeId, index: int = Index,
                       k: int = Query(5, ge=1, le=MAX_K)) -> Response:
        return _rows(atlas.flow(_sae(sae_id), index, k=k))

    @router.get("/saes/{sae_id}/map", tags=["geometry"], summary="2-D feature map (columns)",
                response_model=dict[str, list[Any]])
    async def get_map(sae_id: str = SaeId) -> Response:
        return json_body(atlas.map(_sae(sae_id)).to_dict(as_series=False))

    @router.post("/search/vector", tags=["search"], summary="Features nearest to a direction",
                 response_model=list[dict[str, Any]])
    async def search_vector(query: VectorQuery) -> Response:
        sae_id = _sae(query.sae_id) if query.sae_id is not None else None
        return _rows(atlas.search_vector(query.vector, sae_id=sae_id, k=query.k))

    model_queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")

    @router.post("/search/text", tags=["search"], summary="Features firing on each token of a text",
                 response_model=dict[str, Any])
    async def search_text(query: TextQuery) -> Response:
        ids = [_sae(s) for s in query.sae_ids] if query.sae_ids else None
        result = await asyncio.get_running_loop().run_in_executor(
            model_queue, lambda: atlas.search_text(query.text, sae_ids=ids, k=query.k))
        return json_body(result)

    @router.get("/search/token", tags=["search"], summary="Features centred on / promoting a token",
                response_model=dict[str, Any])
    def search_token(
        token: str | None = Query(None, min_length=1, max_length=256, description="token string"),
        token_id: int | None = Query(None, ge=0, le=MAX_INDEX, description="token id"),
        sae_id: str | None = Query(None, max_length=128),
        k: int = K,
    ) -> Response:
        if (token is None) == (token_id is None):
            raise HTTPException(status_code=400, detail="give exactly one of 'token' or 'token_id'")
        target = token if token is not None else token_id
        return json_body(atlas.search_token(target, sae_id=_sae(sae_id) if sae_id else None, k=k).to_dict())

    @router.get("/analyses", tags=["geometry"], summary="Stored geometry results",
                response_model=list[dict[str, Any]])
    async def list_analyses() -> Response:
        return _rows(atlas.analyses())

    @router.get("/analyses/{kind}/{run}", tags=["geometry"], summary="One geometry result",
                response_model=dict[str, Any])
    def get_analysis(kind: str = Kind, run: str = Path(max_length=128)) -> Response:
        return json_body(atlas.analysis(check_id(kind, "analysis kind"), check_id(run, "run name")).to_dict())

    @router.get("/analyses/{kind}/figures/{name}", tags=["geometry"], summary="A stored figure (PNG)",
                response_class=FileResponse)
    def get_figure(kind: str = Kind, name: str = Path(max_length=200)) -> FileResponse:
        path = atlas.figure_path(check_id(kind, "analysis kind"), name)
        return FileResponse(path, media_type="image/png")

    @router.post("/analyses/circular/{sae_id}", tags=["geometry"],
                 summary="Run circular-feature discovery (server started with --allow-analyses)",
                 response_model=dict[str, Any])
    def run_circular(sae_id: str = SaeId, body: CircularRequest | None = None) -> Response:
        if not allow_analyses:
            raise HTTPException(status_code=403, detail="this server is read-only; start it with --allow-analyses")
        body = body or CircularRequest()
        return json_body(atlas.run_circular(_sae(sae_id), max_tokens=body.max_tokens).to_dict())

    return router
