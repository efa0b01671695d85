"""`Rows[RowT]`: a table result whose rows are of one declared type (a `TypedDict` in
`api.results`), for the `Atlas` methods that used to return bare polars frames.

One object serves both readers. Python gets typed rows (`for row in rows`, `rows[0]`,
`len(rows)`) or, for table work, `rows.frame`: a polars frame whose declared columns have
the dtypes the row type states. HTTP sends `rows.to_dicts()`, the list of rows its
response model `list[RowT]` describes, so the frame -> JSON step lives here only.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from functools import cache
from typing import Annotated, Any, Generic, Literal, TypeVar, overload

import polars as pl
from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema
from typing_extensions import NotRequired, Required, is_typeddict

from sae_atlas.api.results.html import escape

RowT = TypeVar("RowT")
SHOWN = 5
"""Rows printed by `repr`."""

_SCALARS: dict[Any, pl.DataType] = {int: pl.Int64(), float: pl.Float64(), str: pl.String(), bool: pl.Boolean()}


def _unwrap(annotation: Any) -> Any:
    """`annotation` without Annotated / Required / NotRequired / `| None`."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Required, NotRequired):
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def dtype_of(annotation: Any) -> pl.DataType | None:
    """The polars dtype of a row field's annotation (None: kept as stored, e.g. a mapping)."""
    annotation = _unwrap(annotation)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    origin = typing.get_origin(annotation)
    if origin is Literal:
        values = typing.get_args(annotation)
        return _SCALARS.get(type(values[0])) if len({type(v) for v in values}) == 1 else None
    if origin is list:
        inner = dtype_of(typing.get_args(annotation)[0])
        return pl.List(inner) if inner is not None else None
    return None


@cache
def row_schema(row_type: type) -> tuple[dict[str, pl.DataType | None], frozenset[str], bool]:
    """A row type's columns (name -> dtype), the required ones, and whether it allows more
    columns than it names (`extra="allow"`, e.g. a map's group columns)."""
    if not is_typeddict(row_type):
        raise TypeError(f"Rows take a TypedDict row type, not {row_type!r}")
    hints = typing.get_type_hints(row_type, include_extras=True)
    extra = (getattr(row_type, "__pydantic_config__", None) or {}).get("extra") == "allow"
    required = frozenset(name for name, hint in hints.items() if _required(hint, row_type.__total__))
    return {name: dtype_of(hint) for name, hint in hints.items()}, required, extra


def _required(hint: Any, total: bool) -> bool:
    """Whether a TypedDict key must be present (read from the annotation itself: under
    `from __future__ import annotations`, `__required_keys__` misses `NotRequired`)."""
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    origin = typing.get_origin(hint)
    return origin is Required or (total and origin is not NotRequired)


def checked(frame: pl.DataFrame, row_type: type) -> pl.DataFrame:
    """`frame` once its columns fit the row type (an empty frame gets every declared column);
    TypeError naming a column the row type lacks or needs."""
    columns, required, extra = row_schema(row_type)
    unknown = [c for c in frame.columns if c not in columns]
    if unknown and not extra:
        raise TypeError(f"{row_type.__name__} rows have no column {unknown}; declare it")
    if frame.height == 0:
        frame = frame.with_columns(pl.lit(None).alias(c) for c in columns if c not in frame.columns)
    missing = sorted(required - set(frame.columns))
    if missing:
        raise TypeError(f"{row_type.__name__} rows need the columns {missing}")
    return frame


def cast_to(frame: pl.DataFrame, row_type: type) -> pl.DataFrame:
    """`frame` with its declared columns cast to the row type's dtypes."""
    columns = row_schema(row_type)[0]
    casts = {c: dtype for c, dtype in columns.items()
             if dtype is not None and c in frame.columns and frame.schema[c] != dtype}
    return frame.cast(casts) if casts else frame  # type: ignore[arg-type]


def row_limit(info: core_schema.SerializationInfo) -> int | None:
    """The most rows a table field sends: the serialization context's `max_rows` (None: all)."""
    return (info.context or {}).get("max_rows")


def _sent(rows: Rows[Any], info: core_schema.SerializationInfo) -> list[Any]:
    limit = row_limit(info)
    return (rows if limit is None else rows[:limit]).to_dicts()


def _cut(line: str, limit: int = 160) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Rows(Generic[RowT]):
    """Rows of one declared type: iterable and indexable as rows, `rows["column"]` a column
    (polars Series), `.frame` the whole table (polars), `.to_dicts()` what HTTP sends."""

    __slots__ = ("_cast", "_stored", "row_type")

    def __init__(self, row_type: type[RowT], frame: pl.DataFrame) -> None:
        self.row_type = row_type
        self._stored = checked(frame, row_type)  # rows read from it: the same Python values as cast
        self._cast: pl.DataFrame | None = None

    @property
    def frame(self) -> pl.DataFrame:
        """The table as a polars frame, its declared columns of the row type's dtypes."""
        if self._cast is None:
            self._cast = cast_to(self._stored, self.row_type)
        return self._cast

    @classmethod
    def of(cls, row_type: type[RowT], rows: list[RowT]) -> Rows[RowT]:
        """Rows from a list of row dicts."""
        columns = row_schema(row_type)[0]
        schema = {name: dtype for name, dtype in columns.items() if dtype is not None}
        if not rows:
            return cls(row_type, pl.DataFrame(schema=schema))
        return cls(row_type, pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None))

    def __len__(self) -> int:
        return self._stored.height

    def __iter__(self) -> Iterator[RowT]:
        return iter(self._stored.iter_rows(named=True))  # type: ignore[arg-type]

    @overload
    def __getitem__(self, key: int) -> RowT: ...
    @overload
    def __getitem__(self, key: slice) -> Rows[RowT]: ...
    @overload
    def __getitem__(self, key: str) -> pl.Series: ...

    def __getitem__(self, key: int | slice | str) -> RowT | Rows[RowT] | pl.Series:
        """Row `key` (an int), the rows of a slice, or the column named `key`."""
        if isinstance(key, str):
            return self.frame[key]
        if isinstance(key, slice):
            return Rows(self.row_type, self._stored[key])
        if not -len(self) <= key < len(self):
            raise IndexError(f"row {key} of {len(self)}")
        return self._stored.row(key, named=True)  # type: ignore[return-value]

    @property
    def columns(self) -> list[str]:
        """The table's columns."""
        return self._stored.columns

    def to_dicts(self) -> list[RowT]:
        """The rows as plain dicts: what the HTTP service sends (NaN there as null)."""
        return self._stored.to_dicts()  # type: ignore[return-value]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Rows) and other.row_type is self.row_type
                and self.frame.equals(other.frame, null_equal=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = f"Rows[{self.row_type.__name__}]: {len(self)} rows ({', '.join(self.columns)})"
        lines = [head, *(_cut(f"  {row}") for row in self._stored.head(SHOWN).iter_rows(named=True))]
        if len(self) > SHOWN:
            lines.append(f"  ... {len(self) - SHOWN} more")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return f"<b>{escape(self.row_type.__name__)}</b> rows{self.frame._repr_html_()}"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """`Rows[Row]` in a pydantic model: validated from and sent as `list[Row]` (at most
        `max_rows` when the serialization context sets it)."""
        (row_type,) = typing.get_args(source) or (dict[str, Any],)
        rows = handler.generate_schema(list[row_type])  # type: ignore[valid-type]
        from_rows = core_schema.no_info_after_validator_function(lambda value: cls.of(row_type, value), rows)
        return core_schema.json_or_python_schema(
            json_schema=from_rows,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), from_rows]),
            serialization=core_schema.plain_serializer_function_ser_schema(_sent, info_arg=True, return_schema=rows),
        )
