"""Fast JSON bodies for the service: orjson over dataclasses, numpy and plain data.

Handlers return `json_body(obj)` so FastAPI neither re-validates nor walks the result in
Python; NaN and infinities become `null` (valid JSON), numpy arrays and scalars, tensors
and dataclasses serialize directly.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import Response

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def _fallback(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # torch tensors, numpy values orjson does not take natively
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__} as JSON")


def dumps(obj: Any) -> bytes:
    """`obj` as compact JSON bytes."""
    return orjson.dumps(obj, default=_fallback, option=_OPTIONS)


class JSONBody(Response):
    """A JSON response rendered with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def json_body(obj: Any, status_code: int = 200) -> JSONBody:
    return JSONBody(obj, status_code=status_code)
