"""`AnalysisResult`: a stored geometry result, and `AnalysisRunFiles`, a row of the listing
of stored runs."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Annotated, Any

import polars as pl
from pydantic import Field, computed_field
from typing_extensions import TypedDict

from sae_atlas.api.results.html import escape
from sae_atlas.api.results.sae import Status
from sae_atlas.api.results.wire import FileName, FrameRows, JsonResult, wire_payload
from sae_atlas.store.errors import InvalidInputError

MAX_ROWS = 1000
"""Table rows sent by `AnalysisResult.to_dict()` (and so over HTTP)."""


class AnalysisRunFiles(TypedDict):
    """A stored analysis run and its files; a `damaged` run names the bad file and the repair,
    an `unregistered` one the command that registers it again."""

    kind: str
    run: str
    table: str | None
    figures: list[str]
    status: Annotated[Status, Field(
        description="'damaged': a file of the run is missing, truncated or corrupt; 'unregistered': its files "
                    "verify against its JSON but its kind's runs.json does not list it. Neither is served "
                    "(500 naming the file and the repair)")]
    problem: Annotated[str | None, Field(
        description="for a damaged run: the file, what is wrong, the repair; for an unregistered one: the command "
                    "that registers it again")]


@dataclass
class AnalysisResult(JsonResult):
    """A stored geometry result: parameters/summary (`meta`), main table and figures (PNG
    paths). Sent with the table's first rows (`rows`, columns varying by analysis), its
    `columns` and `n_rows`, and the figures' file names."""

    kind: str
    run: str
    meta: dict[str, Any]
    table: Annotated[Annotated[pl.DataFrame, FrameRows(dict[str, Any])] | None, Field(
        serialization_alias="rows", description=f"the main table's first {MAX_ROWS} rows (null: no table)")]
    figures: list[FileName] = field(default_factory=list)

    @computed_field(description="the main table's columns (null: no table)")
    @property
    def columns(self) -> list[str] | None:
        """The main table's columns (None: no table)."""
        return self.table.columns if self.table is not None else None

    @computed_field(description="the main table's number of rows")
    @property
    def n_rows(self) -> int:
        """The main table's number of rows (0: no table)."""
        return self.table.height if self.table is not None else 0

    def to_dict(self, max_rows: int = MAX_ROWS) -> dict[str, Any]:
        """The result as JSON-ready data (table rows capped at `max_rows`)."""
        return wire_payload(self, context={"max_rows": max_rows})

    def _repr_html_(self) -> str:
        images = "".join(
            f"<img style='max-width:360px' src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}'>"
            for p in self.figures[:4]
        )
        table = self.table.head(10)._repr_html_() if self.table is not None else ""
        return f"<b>{escape(self.kind)} / {escape(self.run)}</b>{table}{images}"

    def plot(self) -> Any:
        """Show the stored figures side by side; returns the matplotlib figure."""
        import matplotlib.image as mpimg
        import matplotlib.pyplot as plt

        if not self.figures:
            raise InvalidInputError(f"analysis {self.kind}/{self.run} stored no figures")
        fig, axes = plt.subplots(1, len(self.figures), figsize=(4 * len(self.figures), 4), squeeze=False)
        for ax, path in zip(axes[0], self.figures, strict=False):
            ax.imshow(mpimg.imread(path))
            ax.set_axis_off()
            ax.set_title(path.name, fontsize=8)
        return fig
