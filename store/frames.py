"""Polars frames conformed to a fixed schema before they are written."""

from __future__ import annotations

import polars as pl

from sae_atlas.errors import InvalidInputError


def conform(frame: pl.DataFrame, schema: dict[str, pl.DataType], what: str) -> pl.DataFrame:
    """`frame` with exactly `schema`'s columns, in order and cast to its dtypes
    (InvalidInputError naming the columns that are missing, unexpected or not castable)."""
    missing = [c for c in schema if c not in frame.columns]
    extra = [c for c in frame.columns if c not in schema]
    if missing or extra:
        raise InvalidInputError(f"{what}: missing columns {missing}, unexpected columns {extra}")
    try:
        return frame.select([pl.col(c).cast(t, strict=True) for c, t in schema.items()])
    except pl.exceptions.PolarsError as exc:
        wrong = [c for c, t in schema.items() if frame.schema[c] != t and not _castable(frame[c], t)]
        raise InvalidInputError(f"{what}: columns {wrong} cannot be cast to {[str(schema[c]) for c in wrong]}") from exc


def _castable(column: pl.Series, dtype: pl.DataType) -> bool:
    try:
        column.cast(dtype, strict=True)
    except pl.exceptions.PolarsError:
        return False
    return True
