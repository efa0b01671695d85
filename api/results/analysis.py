"""`AnalysisResult`: a stored geometry result, and `AnalysisRunFiles`, a row of the listing
of stored runs; the typed results of the methods that write one run kind (`CircularDiscovery`,
`EmergenceResult`, `CircleTransferResult`, `CrosscoderRun`, `DepthProfile`: the same payload,
with `rows`, the main table as typed rows)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import polars as pl
from pydantic import Field, computed_field
from typing_extensions import NotRequired, TypedDict

from sae_atlas.api.results.depth import DepthLayer
from sae_atlas.api.results.html import escape
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.sae import Status
from sae_atlas.api.results.wire import FileName, FrameRows, JsonResult, Number, wire_payload
from sae_atlas.errors import InvalidInputError

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


R = TypeVar("R")


def rows_as(result: AnalysisResult, row_type: type[R]) -> Rows[R]:
    """The main table of `result` as rows of `row_type` (TypeError naming a column that does
    not fit; InvalidInputError when the run stored no table)."""
    if result.table is None:
        raise InvalidInputError(f"analysis {result.kind}/{result.run} stored no table")
    return Rows(row_type, result.table)


class CircularCluster(TypedDict):
    """A cluster of circular-feature discovery (`Atlas.run_circular`), best first."""

    rank: int
    cluster_id: int
    size: int
    features: Annotated[list[int], Field(description="the cluster's latents")]
    n_tokens: int
    score: Number
    mixture: list[Number]
    separability: list[Number]
    pair_score: list[Number]
    explained_variance_ratio: list[Number]
    top_token_ids: list[int]
    top_token_mass: list[Number]
    proj_x: list[Number]
    proj_y: list[Number]
    proj_token_ids: list[int]
    proj_rows: list[int]
    top_token_strs: NotRequired[list[str | None]]


class EmergenceScore(TypedDict):
    """One (concept, member) pair of an emergence run: the best single latent's held-out
    AUROC, the k=1 and full probes, and whether the metric reached the threshold."""

    concept: str
    member: str
    auroc: Number
    train_auroc: Number
    latent: int | None
    k1_accuracy: Number
    probe_accuracy: Number
    baseline: Number
    value_selectivity: Number
    value_latent: int | None
    n_concept: int
    n_control: int
    reached: bool
    label: NotRequired[str | None]


class EmergenceOnset(TypedDict):
    """Where one concept emerges over the series: the first member reaching the threshold,
    the member from which it stays, the gaps, re-appearances and the best member."""

    concept: str
    first: str | None
    first_index: int | None
    stable_from: str | None
    gaps: list[str]
    reappears: list[str]
    best: str | None
    best_score: Number


class CircleTransferRow(TypedDict):
    """One fit of a circle transfer: a side ("a" / "b"), a space, its circle probe beside
    its null, cyclic order and period, and the latents spanning it."""

    side: str
    space: str
    dimension: int | None
    r2: Number
    r2_loo: Number
    null: str | None
    null_mean: Number
    p_value: Number
    cyclic_order: bool | None
    fitted_period: Number
    period_fit: Number
    order: list[str] | None
    order_matches_a: bool | None
    latents: list[int] | None
    note: str | None


class CrosscoderNorms(TypedDict):
    """One crosscoder latent: its decoder norm on each side, relative norm and class, and
    with Latent Scaling its betas and ratios."""

    latent: int
    norm_a: Number
    norm_b: Number
    relative_norm: Number
    latent_class: str
    beta_error_a: NotRequired[Number]
    beta_error_b: NotRequired[Number]
    beta_recon_a: NotRequired[Number]
    beta_recon_b: NotRequired[Number]
    nu_error: NotRequired[Number]
    nu_recon: NotRequired[Number]
    scaling_active_tokens: NotRequired[int | None]
    label: NotRequired[str | None]


@dataclass
class CircularDiscovery(AnalysisResult):
    """`Atlas.run_circular`: a stored circular-feature discovery run; `rows` its clusters."""

    @property
    def rows(self) -> Rows[CircularCluster]:
        return rows_as(self, CircularCluster)


@dataclass
class EmergenceResult(AnalysisResult):
    """`Atlas.emergence`: a stored emergence run; `rows` one score per (concept, member),
    `onsets` one row per concept."""

    @property
    def rows(self) -> Rows[EmergenceScore]:
        return rows_as(self, EmergenceScore)

    @property
    def onsets(self) -> Rows[EmergenceOnset]:
        return Rows.of(EmergenceOnset, self.meta["summary"]["onsets"])


@dataclass
class CircleTransferResult(AnalysisResult):
    """`Atlas.compare_circle`: a stored circle transfer; `rows` one fit per side and space."""

    @property
    def rows(self) -> Rows[CircleTransferRow]:
        return rows_as(self, CircleTransferRow)


@dataclass
class CrosscoderRun(AnalysisResult):
    """`Atlas.train_crosscoder` / `latent_scaling`: a crosscoder's stored analysis; `rows`
    one per latent (relative norms, and Latent Scaling columns once computed)."""

    @property
    def rows(self) -> Rows[CrosscoderNorms]:
        return rows_as(self, CrosscoderNorms)


@dataclass
class DepthProfile(AnalysisResult):
    """`Atlas.depth_profile`: a stored depth run; `rows` one per layer (its CKA and tokens
    tables are read by `Atlas.depth_run`)."""

    @property
    def rows(self) -> Rows[DepthLayer]:
        return rows_as(self, DepthLayer)


KIND_TYPES: dict[str, type[AnalysisResult]] = {
    "emergence": EmergenceResult, "circle_transfer": CircleTransferResult, "crosscoder": CrosscoderRun}
"""The result type of each kind whose runs all store one table layout (`circular` and
`depth` hold several: their producing methods say which they return)."""
