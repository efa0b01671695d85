"""The OpenAPI document of one server: FastAPI's, plus what only the served atlas knows
(the residual widths a `/search/vector` direction may have, and examples naming its SAEs,
features, tokens and analyses: `api.http.examples`) and what pydantic enforces but does not
publish (a tagged union's tag is required even where a member gives it a default), so that
every request the document calls valid is one the server accepts."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http.examples import add_examples


def atlas_openapi(app: FastAPI, atlas: Atlas) -> dict[str, Any]:
    """The document (built once per worker, then kept on `app.openapi_schema`)."""
    if app.openapi_schema is None:
        document = FastAPI.openapi(app)
        widths = sorted({int(atlas.sae_info(s)["d_in"]) for s in atlas.sae_ids if atlas.sae_info(s)["d_in"]})
        vector = document.get("components", {}).get("schemas", {}).get("VectorQuery", {}).get("properties", {})
        if "vector" in vector and widths:
            vector["vector"]["anyOf"] = [{"minItems": w, "maxItems": w} for w in widths]
            vector["vector"]["description"] += f" (d_in of this atlas's SAEs: {', '.join(map(str, widths))})"
        _require_union_tags(document)
        add_examples(document, atlas)
        app.openapi_schema = document
    return app.openapi_schema


def _require_union_tags(node: Any, schemas: dict[str, Any] | None = None) -> None:
    """Add each discriminator's property to the `required` list of the schemas it maps to
    (pydantic cannot pick a member of a tagged union without the tag)."""
    schemas = schemas if schemas is not None else node.get("components", {}).get("schemas", {})
    if isinstance(node, dict):
        tag = node.get("discriminator", {})
        for ref in tag.get("mapping", {}).values() if isinstance(tag, dict) else ():
            member = schemas.get(ref.rsplit("/", 1)[-1], {})
            if tag["propertyName"] not in member.setdefault("required", []):
                member["required"].append(tag["propertyName"])
        for value in node.values():
            _require_union_tags(value, schemas)
    elif isinstance(node, list):
        for value in node:
            _require_union_tags(value, schemas)
