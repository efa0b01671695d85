"""How a result travels: the annotations that tell pydantic how to send the values a result
keeps for Python (polars frames as lists of rows, tensors not at all, figure paths as file
names), and `to_dict()`, the payload the result type's JSON schema describes.

The schema and the payload come from one `TypeAdapter` per result type, so the HTTP
service's OpenAPI document, its bodies and the CLI's `--json` cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, TypeVar

import polars as pl
from pydantic import Field, GetCoreSchemaHandler, PlainSerializer, TypeAdapter, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import core_schema

from sae_atlas.api.results.rows import Rows, row_limit

T = TypeVar("T")

Number = float | None
"""A float that may be NaN or infinite: sent as null (orjson), hence nullable in the schema."""


@dataclass(frozen=True)
class FrameRows:
    """Annotation of a polars-frame field, `Annotated[pl.DataFrame, FrameRows(Row)]`: sent as
    a list of `Row`s (at most `max_rows` when the serialization context sets it)."""

    row: Any

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        rows = handler.generate_schema(list[self.row])
        from_rows = core_schema.no_info_after_validator_function(pl.DataFrame, rows)
        return core_schema.json_or_python_schema(
            json_schema=from_rows,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(pl.DataFrame), from_rows]),
            serialization=core_schema.plain_serializer_function_ser_schema(
                _frame_rows, info_arg=True, return_schema=rows),
        )


def _frame_rows(frame: pl.DataFrame, info: core_schema.SerializationInfo) -> list[dict[str, Any]]:
    limit = row_limit(info)
    return (frame if limit is None else frame.head(limit)).to_dicts()


class _Unchecked:
    """Annotation: any value, not validated (tensors have no pydantic schema)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.any_schema()


PythonOnly = Annotated[T, _Unchecked(), Field(exclude=True), SkipJsonSchema()]
"""`PythonOnly[torch.Tensor]`: a field kept for Python use, never sent and not in the schema."""

FileName = Annotated[Path, PlainSerializer(lambda path: path.name, return_type=str),
                     WithJsonSchema({"type": "string", "description": "a file name"})]
"""A path sent as its file name."""


@cache
def _adapter(result_type: type) -> TypeAdapter[Any]:
    return TypeAdapter(result_type)


def wire_payload(result: Any, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """`result` (a result dataclass) as the JSON-ready data its type's JSON schema describes
    (NaN stays a float here; the HTTP bodies send it as null)."""
    return _adapter(type(result)).dump_python(result, mode="json", by_alias=True, context=context)


class JsonResult:
    """Base of the result dataclasses: `to_dict()` is the payload of the HTTP service, and
    `repr()` a one-line summary (every field, long values as their size)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__repr__ = JsonResult.__repr__  # set on the class itself, so @dataclass keeps it

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data (what the HTTP service sends)."""
        return wire_payload(self)

    def __repr__(self) -> str:
        fields = getattr(self, "__dataclass_fields__", {})
        return f"{type(self).__name__}({', '.join(f'{name}={_short(getattr(self, name))}' for name in fields)})"


def _short(value: Any, limit: int = 60) -> str:
    """A field's value for `repr`: scalars as written (cut at `limit` characters),
    collections and frames as their size."""
    if isinstance(value, pl.DataFrame):
        return f"<{value.height}x{value.width} frame>"
    if isinstance(value, Rows):
        return f"<{len(value)} {value.row_type.__name__} rows>"
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} items]"
    if isinstance(value, dict):
        return f"{{{len(value)} keys}}"
    if hasattr(value, "shape"):
        return f"<{type(value).__name__} {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
