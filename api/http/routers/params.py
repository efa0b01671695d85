"""Path parameters shared by the routers, with the limits that show in `/openapi.json`
(a route's query parameters are its operation's object, `api.operations`), and the error
statuses each route documents."""

from __future__ import annotations

from typing import Any

from fastapi import Path

from sae_atlas.api.bounds import MAX_INDEX
from sae_atlas.api.http.protocol import MAX_URL_BYTES
from sae_atlas.api.http.schemas import ErrorBody
from sae_atlas.store.layout import ID_PATTERN, MAX_ID_LENGTH

SaeId = Path(description="SAE id, e.g. blocks.6.hook_resid_post-topk-4608", max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)
Index = Path(ge=0, le=MAX_INDEX, description="latent index")
Kind = Path(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="analysis kind, e.g. circular")
Run = Path(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="run name")
Comparison = Path(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="name of a stored comparison run")
Crosscoder = Path(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description="id of a stored crosscoder")
FigureName = Path(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN.removesuffix(r"\.?$") + r"\.png$",
                  description="a PNG file of the kind's folder, e.g. <run>.png")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer, all with the `ErrorBody` shape."""
    return {status: {"model": ErrorBody, "description": ERROR_MEANINGS[status]} for status in statuses}


ERROR_MEANINGS = {
    400: "invalid input (an id with unsafe characters, a vector of the wrong width, ...)",
    401: "missing or wrong bearer token (servers started with a token)",
    403: "not allowed on this server",
    404: "no such SAE, feature, analysis or figure",
    413: "request body larger than the server's limit",
    414: f"request URL longer than {MAX_URL_BYTES} bytes (send long inputs in a POST body)",
    422: "request validation failed (each bad field is named)",
    500: "a damaged atlas file (the file and the repair command are named)",
}
DATA_ERRORS = error_responses(401, 414, 422, 500)
"""Every data route: auth, URL length, validation and integrity errors."""
