"""Imported feature explanations: a Neuronpedia explanations export (JSON: a list of
objects with `index` and `description`, or an object holding such a list under
`explanations`) or a CSV with columns `feature` and `explanation`. Both become a frame
with columns latent, text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.errors import InvalidInputError

EXPLANATION_SCHEMA = {"latent": pl.Int64, "text": pl.String}


def read_explanations(path: str | Path, d_sae: int) -> pl.DataFrame:
    """Explanations from `path` (.json Neuronpedia export or .csv feature,explanation), each
    latent checked against `d_sae`; InvalidInputError names what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"no explanations file {path}")
    rows = _json_rows(path) if path.suffix.lower() == ".json" else _csv_rows(path)
    frame = pl.DataFrame(rows, schema=EXPLANATION_SCHEMA).filter(pl.col("text").str.strip_chars() != "")
    bad = frame.filter((pl.col("latent") < 0) | (pl.col("latent") >= d_sae))
    if bad.height:
        raise InvalidInputError(f"{path}: feature {bad['latent'][0]} is out of range 0..{d_sae - 1}")
    if frame.height == 0:
        raise InvalidInputError(f"{path} holds no explanations")
    return frame


def _json_rows(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path} is not valid JSON ({exc})") from exc
    if isinstance(data, dict):
        data = data.get("explanations")
    if not isinstance(data, list):
        raise InvalidInputError(f"{path}: expected a list of explanations (objects with 'index' and 'description')")
    rows = []
    for item in data:
        if not isinstance(item, dict) or "index" not in item or "description" not in item:
            raise InvalidInputError(f"{path}: every explanation needs 'index' and 'description', got {item!r:.120}")
        rows.append({"latent": _int(item["index"], path), "text": str(item["description"])})
    return rows


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    try:
        frame = pl.read_csv(path, infer_schema=False)
    except Exception as exc:  # polars raises several error types for malformed CSV
        raise InvalidInputError(f"{path} is not a readable CSV ({exc})") from exc
    if not {"feature", "explanation"} <= set(frame.columns):
        raise InvalidInputError(f"{path}: needs columns 'feature' and 'explanation', has {frame.columns}")
    return [{"latent": _int(f, path), "text": e or ""} for f, e in frame.select("feature", "explanation").iter_rows()]


def _int(value: Any, path: Path) -> int:
    try:
        return int(str(value).strip())
    except ValueError as exc:
        raise InvalidInputError(f"{path}: feature index {value!r} is not an integer") from exc
