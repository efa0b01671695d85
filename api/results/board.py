"""`Board`: the eval board as sent over HTTP (`GET /board`), one row per SAE."""

from __future__ import annotations

from typing import Annotated

import polars as pl
from pydantic import Field
from typing_extensions import TypedDict

from sae_atlas.api.results.sae import Status

MetricValue = float | int | bool | None


class BoardRow(TypedDict):
    """One SAE's eval metrics."""

    sae_id: str
    status: Annotated[Status, Field(description="'damaged': an eval result of the SAE failed verification; 'unregistered': atlas.json does not list the SAE")]
    problem: Annotated[str | None, Field(description="for a damaged row: the files, what is wrong, the repair")]
    metrics: Annotated[dict[str, MetricValue], Field(
        description="'<eval>/<metric>' -> value (SAEBench metric names); null where undefined or not run")]


class Board(TypedDict):
    """The eval board: every metric column and one row per SAE."""

    columns: Annotated[list[str], Field(description="the '<eval>/<metric>' columns, sorted")]
    rows: list[BoardRow]


def board_payload(frame: pl.DataFrame) -> Board:
    """The board frame (`api.services.board.board`) as the HTTP payload."""
    columns = [c for c in frame.columns if "/" in c]
    rows: list[BoardRow] = [
        {"sae_id": row["sae_id"], "status": row["status"], "problem": row["problem"],
         "metrics": {c: row[c] for c in columns}}
        for row in frame.iter_rows(named=True)
    ]
    return {"columns": columns, "rows": rows}
