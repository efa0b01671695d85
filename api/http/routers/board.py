"""The HTTP layer of `board`; its other layers: `sae_atlas.api.results.board` (typed-result),
`sae_atlas.api.services.board` (service).

`/board`: every SAE's eval metrics, read from its verified `evals/<eval>.json` results."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS
from sae_atlas.api.results.board import Board

router = APIRouter(tags=["evals"], responses=DATA_ERRORS)


@router.get("/board", summary="Eval metrics of every SAE (one row per SAE)", response_model=Board)
def get_board(atlas: AtlasDep) -> Response:
    return json_body(atlas.board())
