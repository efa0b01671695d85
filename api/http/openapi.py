"""The OpenAPI document of one server: FastAPI's, plus what only the served atlas knows
(the residual widths a `/search/vector` direction may have), so that every request the
document calls valid is one the server accepts."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from api.atlas import Atlas


def atlas_openapi(app: FastAPI, atlas: Atlas) -> dict[str, Any]:
    """The document (built once per worker, then kept on `app.openapi_schema`)."""
    if app.openapi_schema is None:
        document = FastAPI.openapi(app)
        widths = sorted({int(atlas.sae_info(s)["d_in"]) for s in atlas.sae_ids if atlas.sae_info(s)["d_in"]})
        vector = document.get("components", {}).get("schemas", {}).get("VectorQuery", {}).get("properties", {})
        if "vector" in vector and widths:
            vector["vector"]["anyOf"] = [{"minItems": w, "maxItems": w} for w in widths]
            vector["vector"]["description"] += f" (d_in of this atlas's SAEs: {', '.join(map(str, widths))})"
        app.openapi_schema = document
    return app.openapi_schema
