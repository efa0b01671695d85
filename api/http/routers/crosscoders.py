"""`/crosscoders`: stored crosscoders (read-only; `sae-atlas train-crosscoder` writes them),
their latents filtered by class and one latent's card."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sae_atlas.api.bounds import MAX_INDEX, MAX_K, MAX_LIST
from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, Crosscoder, Index, error_responses
from sae_atlas.api.results.crosscoder import CrosscoderLatentCard, CrosscoderLatents, CrosscoderRow
from sae_atlas.saes.compare.crosscoder import LatentClass
from sae_atlas.store.layout import ID_PATTERN, MAX_ID_LENGTH

router = APIRouter(tags=["crosscoders"], responses=DATA_ERRORS)


@router.get("/crosscoders", summary="Stored crosscoders: sides and latents per class",
            response_model=list[CrosscoderRow])
def list_crosscoders(atlas: AtlasDep) -> Response:
    return json_body(atlas.crosscoders())


@router.get("/crosscoders/{crosscoder}/latents", summary="A crosscoder's latents by class, with the relative-norm "
            "histogram", response_model=CrosscoderLatents, responses=error_responses(400, 404))
def crosscoder_latents(
    atlas: AtlasDep, crosscoder: str = Crosscoder,
    latent_class: LatentClass | None = Query(None, description="only a_only, shared or b_only latents"),
    sort: str = Query("relative_norm", max_length=MAX_ID_LENGTH, pattern=ID_PATTERN,
                      description="a numeric column: relative_norm, norm_a, norm_b, latent or a Latent Scaling one"),
    descending: bool = Query(True, description="largest first"),
    offset: int = Query(0, ge=0, le=MAX_INDEX), limit: int = Query(100, ge=1, le=MAX_LIST),
) -> Response:
    return json_body(atlas.crosscoder_latents(crosscoder, latent_class=latent_class, sort=sort, descending=descending,
                                              offset=offset, limit=limit))


@router.get("/crosscoders/{crosscoder}/latents/{index}", summary="One crosscoder latent: both decoder norms and "
            "the nearest atlas features per side", response_model=CrosscoderLatentCard,
            responses=error_responses(400, 404))
def crosscoder_latent(atlas: AtlasDep, crosscoder: str = Crosscoder, index: int = Index,
                      k: int = Query(5, ge=1, le=MAX_K, description="nearest features per side")) -> Response:
    return json_body(atlas.crosscoder_latent(crosscoder, index, k=k))
