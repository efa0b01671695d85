"""The service layer of `board`; its other layers: `sae_atlas.api.http.routers.board` (HTTP),
`sae_atlas.api.results.board` (typed-result).

The eval board: one row per SAE, one column per eval metric, read from the verified
`saes/<id>/evals/<eval>.json` results (`saes.eval.results`)."""

from __future__ import annotations

from typing import Any

import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.board import BOARD_KEYS, Board
from sae_atlas.errors import IntegrityError
from sae_atlas.saes.eval.results import read_result, stored_evals


def board_row(ctx: AtlasContext, sae_id: str, unregistered: set[str]) -> dict[str, Any]:
    """`sae_id`, `status` ("ok"; "damaged" when a result fails verification, its columns
    then left out and `problem` naming the file and the repair; "unregistered" for an SAE
    atlas.json does not list, `problem` naming `sae-atlas register`) and one
    `<eval>/<metric>` entry per metric of every stored result."""
    row: dict[str, Any] = {"sae_id": sae_id, "status": "ok", "problem": None}
    problems = []
    if sae_id in unregistered:
        row.update(status="unregistered", problem=ctx.describe(ctx.layout.unregistered_sae(sae_id)))
    try:
        names = stored_evals(ctx.root, sae_id)
    except IntegrityError as exc:  # registered, but its folder is gone
        names, problems = [], [ctx.describe(exc)]
    for name in names:
        try:
            output = read_result(ctx.root, sae_id, name)
        except IntegrityError as exc:
            problems.append(ctx.describe(exc))
            continue
        for metrics in output["eval_result_metrics"].values():
            row.update({f"{name}/{metric}": value for metric, value in metrics.items()})
    if problems:
        row.update(status="damaged", problem="; ".join(problems))  # a damaged result outranks unregistered
    return row


def board(ctx: AtlasContext) -> Board:
    """The board: one row per SAE, its metrics by `<eval>/<metric>` column (`Board.frame`:
    `sae_id`, `status`, `problem`, then the metric columns sorted by name, null where an SAE
    has no result of that eval)."""
    unregistered = set(ctx.layout.unregistered_sae_ids())  # read atlas.json once, not per row
    rows = [board_row(ctx, sae_id, unregistered) for sae_id in ctx.sae_ids()]
    metrics = sorted({key for row in rows for key in row} - set(BOARD_KEYS))
    schema = {"sae_id": pl.String, "status": pl.String, "problem": pl.String}
    if not rows:
        return Board.of(pl.DataFrame(schema=schema))
    frame = pl.from_dicts(rows, infer_schema_length=None)
    return Board.of(frame.select(*BOARD_KEYS, *metrics).cast(schema))  # type: ignore[arg-type]
