"""`/crosscoders`: stored crosscoders (read-only; `sae-atlas train-crosscoder` writes them),
their latents filtered by class and one latent's card."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, Crosscoder, Index, error_responses
from sae_atlas.api.operations.pages import CrosscoderLatentParams, CrosscoderLatentsParams
from sae_atlas.api.results.crosscoder import CrosscoderLatentCard, CrosscoderLatents, CrosscoderRow

router = APIRouter(tags=["crosscoders"], responses=DATA_ERRORS)


@router.get("/crosscoders", summary="Stored crosscoders: sides and latents per class",
            response_model=list[CrosscoderRow])
def list_crosscoders(atlas: AtlasDep) -> Response:
    return json_body(atlas.crosscoders())


@router.get("/crosscoders/{crosscoder}/latents", summary="A crosscoder's latents by class, with the relative-norm "
            "histogram", response_model=CrosscoderLatents, responses=error_responses(400, 404))
def crosscoder_latents(atlas: AtlasDep, params: Annotated[CrosscoderLatentsParams, Query()],
                       crosscoder: str = Crosscoder) -> Response:
    return json_body(atlas.crosscoder_latents(crosscoder, **params.model_dump()))


@router.get("/crosscoders/{crosscoder}/latents/{index}", summary="One crosscoder latent: both decoder norms and "
            "the nearest atlas features per side", response_model=CrosscoderLatentCard,
            responses=error_responses(400, 404))
def crosscoder_latent(atlas: AtlasDep, params: Annotated[CrosscoderLatentParams, Query()],
                      crosscoder: str = Crosscoder, index: int = Index) -> Response:
    return json_body(atlas.crosscoder_latent(crosscoder, index, **params.model_dump()))
