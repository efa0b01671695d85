"""The typed-result layer of `board`; its other layers: `sae_atlas.api.http.routers.board` (HTTP),
`sae_atlas.api.services.board` (service).

`Board`: the eval board (`Atlas.board()`, `GET /board`), one row per SAE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import polars as pl
from pydantic import Field
from typing_extensions import TypedDict

from sae_atlas.api.results.sae import Status
from sae_atlas.api.results.wire import JsonResult

MetricValue = float | int | bool | None
BOARD_KEYS = ("sae_id", "status", "problem")


class BoardRow(TypedDict):
    """One SAE's eval metrics."""

    sae_id: str
    status: Annotated[Status, Field(description="'damaged': an eval result of the SAE failed verification; 'unregistered': atlas.json does not list the SAE")]
    problem: Annotated[str | None, Field(description="for a damaged row: the files, what is wrong, the repair")]
    metrics: Annotated[dict[str, MetricValue], Field(
        description="'<eval>/<metric>' -> value (SAEBench metric names); null where undefined or not run")]


@dataclass
class Board(JsonResult):
    """The eval board: every metric column and one row per SAE. `frame` is the same board
    as one wide polars frame (`sae_id`, `status`, `problem`, then one column per metric)."""

    columns: Annotated[list[str], Field(description="the '<eval>/<metric>' columns, sorted")]
    rows: list[BoardRow]

    @property
    def frame(self) -> pl.DataFrame:
        """One row per SAE: `sae_id`, `status`, `problem`, then the metric columns (null where
        an SAE has no result of that eval)."""
        schema = {"sae_id": pl.String, "status": pl.String, "problem": pl.String}
        if not self.rows:
            return pl.DataFrame(schema=schema)
        flat = [{"sae_id": r["sae_id"], "status": r["status"], "problem": r["problem"],
                 **{c: r["metrics"].get(c) for c in self.columns}} for r in self.rows]
        return pl.from_dicts(flat, infer_schema_length=None).select(*BOARD_KEYS, *self.columns).cast(schema)  # type: ignore[arg-type]

    @classmethod
    def of(cls, frame: pl.DataFrame) -> Board:
        """The board from its wide frame (`api.services.board.board_frame`)."""
        columns = [c for c in frame.columns if c not in BOARD_KEYS]
        rows: list[BoardRow] = [
            {"sae_id": row["sae_id"], "status": row["status"], "problem": row["problem"],
             "metrics": {c: row[c] for c in columns}}
            for row in frame.iter_rows(named=True)
        ]
        return cls(columns=columns, rows=rows)

    def _repr_html_(self) -> str:
        return f"<b>eval board</b> ({len(self.rows)} SAEs, {len(self.columns)} metrics){self.frame._repr_html_()}"
