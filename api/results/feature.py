"""The typed-result layer of `feature`; its other layers: `sae_atlas.api.commands.feature` (CLI).

`Feature`: one SAE latent's page (stats, histogram, top examples, logit effects,
neighbours, map position, geometry) and its row types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, with_config
from typing_extensions import NotRequired, TypedDict

from sae_atlas.api.results.depth import FeatureDepth
from sae_atlas.api.results.html import escape, format_value, highlight_tokens, rows_table
from sae_atlas.api.results.wire import JsonResult, Number


class FeatureStats(TypedDict):
    """Activation statistics of one latent; `quantiles` maps a level ("0.5") to a value."""

    n_active: int
    density: Number
    mean_act: Number
    mean_active_act: Number
    max_act: Number
    decoder_norm: Number
    quantiles: dict[str, Number]


class Histogram(TypedDict):
    """Activation histogram: bin `edges` (n+2, the first 0) and `counts` (n+1)."""

    edges: list[Number]
    counts: list[int]


class ExampleContext(TypedDict):
    """A top example on a feature page: the window's tokens and activations."""

    act: Number
    block: int
    pos: int
    centre: int
    tokens: list[str | None]
    acts: list[Number]


class StoredExample(ExampleContext):
    """A stored example (top-k or an activation band) with its token ids and source
    (`Atlas.examples` rows)."""

    latent: int
    kind: Literal["top", "band"]
    band: int | None
    band_lo: Number
    band_hi: Number
    rank: int
    token_id: int
    doc_id: int | None
    token_ids: list[int]


class LatentStats(TypedDict):
    """A latent's activation statistics over the summarized tokens (`sae-atlas summarize`)."""

    latent: int
    n_active: int
    density: Number
    mean_act: Number
    mean_active_act: Number
    max_act: Number


class FeatureRow(LatentStats):
    """One row of the per-latent table as its pages send it (`GET /saes/{id}/features`)."""

    label: Annotated[str | None, Field(description="the latent's offline label")]


class LatentSummary(LatentStats):
    """One latent's row of an SAE's summary table (`features.parquet`, `sae-atlas summarize`):
    activation statistics, quantiles at the table's levels, the histogram's top edge and
    counts, the decoder norm and the tokens its decoder direction most promotes / suppresses."""

    quantiles: list[Number] | None
    hist_top: Number
    hist_counts: list[int] | None
    decoder_norm: Number
    top_logit_ids: list[int] | None
    top_logit_values: list[Number] | None
    top_logit_tokens: list[str | None] | None
    bottom_logit_ids: list[int] | None
    bottom_logit_values: list[Number] | None
    bottom_logit_tokens: list[str | None] | None


class LogitEffect(TypedDict):
    """A token the feature's decoder direction promotes or suppresses."""

    token_id: int
    token: str | None
    value: Number


class Match(TypedDict):
    """A search hit: a latent and the cosine of its decoder direction."""

    sae_id: str
    latent: int
    cosine: Number
    rank: int
    layer: int
    label: NotRequired[Annotated[str | None, Field(description="the latent's offline label")]]
    explanations: NotRequired[Annotated[list[str] | None, Field(description="imported explanations")]]


@with_config(ConfigDict(extra="allow"))
class MapPosition(TypedDict):
    """A latent's place on its SAE's 2-D map (label columns such as `cluster` when present)."""

    latent: int
    x: Number
    y: Number
    knn_overlap: Number


class GeometryRecord(TypedDict):
    """A geometry result a feature belongs to: a circle (`circle`: discovered cluster;
    `concept`: selective feature of a concept search), a hierarchy node or a lobe."""

    latent: int
    kind: str
    run: str
    group: Annotated[int | None, Field(description="cluster id, lobe id, or place in the concept's span")]
    name: str | None
    in_circle: bool
    period: Annotated[Number, Field(description="fitted period of the circle (null: not measured)")]
    score: Number


@dataclass
class Feature(JsonResult):
    """One SAE latent: stats, histogram, top examples, logit effects, neighbours, map.
    `neighbours`/`cross_layer` are None before `sae-atlas index`, `map_position` before
    `sae-atlas analyze map`."""

    sae_id: str
    index: int
    hook: Annotated[str, Field(description="the hook the feature reads (where it activates)")]
    stats: FeatureStats
    histogram: Histogram
    examples: list[ExampleContext]
    top_logits: list[LogitEffect]
    bottom_logits: list[LogitEffect]
    neighbours: list[Match] | None = None
    cross_layer: list[Match] | None = None
    map_position: MapPosition | None = None
    damaged_saes: Annotated[dict[str, str] | None, Field(
        description="damaged SAEs left out of cross_layer: SAE id -> the damaged file and its repair")] = None
    geometry: Annotated[list[GeometryRecord], Field(
        description="the geometry results the feature belongs to: circles, concept spans, lobes")] = field(
        default_factory=list)
    label: Annotated[str | None, Field(
        description="offline label computed from the feature's statistics (null before "
                    "`sae-atlas search labels --rebuild`)")] = None
    explanations: Annotated[list[str] | None, Field(description="imported explanations")] = None
    hook_out: Annotated[str | None, Field(
        description="the hook a transcoder's feature writes (its decoder direction; logit effects are "
                    "read there); null for an SAE feature, which writes the hook it reads")] = None
    depth: Annotated[list[FeatureDepth], Field(
        description="where it fires in depth terms, per stored depth run that joined its SAE (`analyze depth "
                    "--sae`): its tokens' local dimension and trajectory against every token's")] = field(
        default_factory=list)

    def _repr_html_(self) -> str:
        s = self.stats
        head = (f"<b>{escape(self.sae_id)} / feature {self.index}</b> "
                f"<span style='color:#666'>({escape(self.hook)})</span><br>"
                f"density {format_value(s['density'])} &middot; mean active {format_value(s['mean_active_act'])} "
                f"&middot; max {format_value(s['max_act'])}")
        scale = s["max_act"] or None
        examples = "".join(
            f"<div style='font-family:monospace;margin:2px 0'>{highlight_tokens(e['tokens'], e['acts'], scale)}"
            f" <span style='color:#888'>{e['act']:.3g}</span></div>"
            for e in self.examples
        )
        logits = " ".join(f"<code>{escape(t['token'])}</code> {t['value']:+.3g}" for t in self.top_logits[:8])
        neighbours = rows_table(self.neighbours, ["latent", "cosine"])
        depth = "".join(f"<div><b>depth</b> ({escape(d['run'])}) {escape(d['says'])}</div>" for d in self.depth)
        return (f"<div style='border:1px solid #ddd;padding:6px;max-width:720px'>{head}{depth}"
                f"<div><b>top examples</b>{examples or ' <i>none</i>'}</div>"
                f"<div><b>promotes</b> {logits or '<i>no logit effects</i>'}</div>"
                f"<div><b>neighbours</b>{neighbours}</div></div>")

    def plot(self, ax: Any = None) -> Any:
        """Bar chart of the activation histogram (log-spaced bins); returns the axes."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(5, 2.5))[1]
        edges, counts = self.histogram["edges"], self.histogram["counts"]
        lo = [max(e, edges[1] / 2) for e in edges[:-1]]
        ax.bar(lo, counts, width=[b - a for a, b in zip(lo, edges[1:], strict=False)], align="edge")
        ax.set_xscale("log")
        ax.set_xlabel("activation")
        ax.set_ylabel("tokens")
        ax.set_title(f"{self.sae_id} / {self.index}")
        return ax
