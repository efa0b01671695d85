"""The typed-result layer of `depth`; its other layers: `sae_atlas.api.analyses.depth`
(analysis-run), `sae_atlas.api.http.routers.depth` (HTTP), `sae_atlas.api.operations.depth`
(parameter), `sae_atlas.api.services.depth` (service).

`DepthRun`: a stored depth analysis (`analyses/depth/<run>`) as the explorer's Depth page
reads it, `DepthRunRow`, a row of the listing of depth runs, and `FeatureDepth`, where one
SAE feature fires in depth terms (on its feature page)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, with_config
from typing_extensions import NotRequired, TypedDict

from sae_atlas.api.results.html import escape, format_value
from sae_atlas.api.results.sae import Status
from sae_atlas.api.results.wire import FileName, JsonResult, Number

DepthKind = Literal["corpus", "families", "pair"]
"""A depth run over a corpus stream (`analyze depth`), over prompt families (`--families`), or
of two models on the same texts (`--model-b`)."""
DepthShape = Literal["compressing", "expanding", "typical"]
"""Where a feature's tokens sit in local dimension against every token of its layer."""


class DepthRunRow(TypedDict):
    """A stored depth run: what it streamed, its headline and its status."""

    run: str
    kind: DepthKind
    model: str | None
    model_b: Annotated[str | None, Field(description="the second model of a pair run")]
    layers: list[int]
    n_tokens: Annotated[int | None, Field(description="tokens streamed (null: a families run)")]
    id_peak_layer: Annotated[int | None, Field(description="layer of the highest TwoNN dimension (null: families)")]
    families: Annotated[list[str] | None, Field(description="the prompt families of a families run")]
    sae_ids: Annotated[list[str], Field(description="stored SAEs whose features the run joined (--sae)")]
    status: Annotated[Status, Field(
        description="'damaged': a file of the run is missing, truncated or corrupt; 'unregistered': its files "
                    "verify but analyses/depth/runs.json does not list it. Neither is served (500 naming the "
                    "file and the repair)")]
    problem: Annotated[str | None, Field(
        description="for a damaged run: the file, what is wrong, the repair; for an unregistered one: the command "
                    "that registers it again")]


@with_config(ConfigDict(extra="allow"))
class DepthLayer(TypedDict):
    """One layer of the depth profile (further columns of the run's main table pass through)."""

    layer: int
    twonn: Annotated[Number, Field(description="TwoNN intrinsic dimension of the token cloud")]
    twonn_low: NotRequired[Annotated[Number, Field(description="bootstrap interval of the TwoNN dimension, low "
                                                               "end (runs stored before it have none)")]]
    twonn_high: NotRequired[Annotated[Number, Field(description="bootstrap interval of the TwoNN dimension, "
                                                                "high end")]]
    mle: Annotated[Number, Field(description="Levina-Bickel MLE dimension")]
    mle_low: Annotated[Number, Field(description="bootstrap interval of the MLE dimension, low end")]
    mle_high: Annotated[Number, Field(description="bootstrap interval of the MLE dimension, high end")]
    lid_mean: Annotated[Number, Field(description="mean local (k-NN MLE) dimension of the tokens")]
    lid_q10: Number
    lid_q50: Number
    lid_q90: Number
    step_length: Annotated[Number, Field(description="mean step into this layer (null at the first)")]
    curvature: Annotated[Number, Field(description="mean turning angle (radians) into this layer (null at the "
                                                   "first two)")]
    consecutive_cosine: Annotated[Number, Field(description="mean cosine of a token's state to its previous one")]
    cosine_to_final: Annotated[Number, Field(description="mean cosine of a token's state to its final-layer one")]
    logit_top1: Annotated[Number, Field(description="logit lens: share of tokens whose top-1 is the final top-1")]
    logit_kl: Annotated[Number, Field(description="logit lens: mean KL(final || lens)")]
    logit_median_rank: Number
    tuned_top1: Annotated[Number, Field(description="tuned lens: share agreeing with the final top-1")]
    tuned_kl: Number
    tuned_median_rank: Number
    tuned_fit_loss: Annotated[Number, Field(description="the tuned lens's fitting loss on its fitting split")]


class CkaMatrix(TypedDict):
    """Debiased linear CKA between every pair of layers (`values[i][j]`: row layer `layers[i]`,
    column layer `layers_b[j]`); a pair run's rows are model A's layers, its columns model B's."""

    layers: list[int]
    layers_b: list[int]
    values: list[list[Number]]


@with_config(ConfigDict(extra="allow"))
class DepthShift(TypedDict):
    """A pair run at one layer read in both models: TwoNN of each, and the MLE dimension and
    mean local dimension of each with the shift from A to B, its paired bootstrap interval and
    its paired permutation p-value."""

    layer: int
    twonn_a: Number
    twonn_b: Number
    mle_a: Number
    mle_b: Number
    mle_shift: Number
    mle_shift_low: Number
    mle_shift_high: Number
    mle_shift_p: Number
    lid_a: Number
    lid_b: Number
    lid_shift: Number
    lid_shift_low: Number
    lid_shift_high: Number
    lid_shift_p: Number


class ExtremeToken(TypedDict):
    """A subsampled token with an extreme trajectory, and where it is in the corpus stream."""

    metric: Annotated[str, Field(description="'convergence_index' (lowest first) or 'mean_curvature' (highest "
                                             "first)")]
    value: Number
    block: int
    position: int
    token: Annotated[int, Field(description="token id")]
    text: Annotated[str | None, Field(description="the token's text (null: the run did not record it)")]
    context: Annotated[str | None, Field(description="the text of its block up to it (null: not recorded)")]


class Distribution(TypedDict):
    """Counts of one per-token trajectory metric over the run's subsampled tokens."""

    edges: list[float]
    counts: list[int]
    mean: Number
    median: Number


class FeatureDepth(TypedDict):
    """Where one SAE feature fires in depth terms (a depth run with the SAE joined, `--sae`):
    its firing tokens' local dimension at its layer and trajectory, against every token's."""

    run: str
    sae_id: str
    feature: int
    layer: int
    n_fires: Annotated[int, Field(description="subsampled tokens it fires on")]
    lid_mean: Annotated[Number, Field(description="mean local dimension of those tokens at its layer")]
    lid_all: Annotated[Number, Field(description="mean local dimension of every subsampled token at its layer")]
    lid_z: Annotated[Number, Field(description="z-score of the shift against as many random tokens")]
    lid_layer_q10: Annotated[Number, Field(description="the layer's 10% quantile of local dimension")]
    lid_layer_q90: Annotated[Number, Field(description="the layer's 90% quantile of local dimension")]
    convergence_index_mean: Number
    convergence_index_z: Number
    curvature_mean: Number
    curvature_z: Number
    shape: Annotated[DepthShape, Field(description="'compressing': local dimension below the layer's (z <= -2); "
                                                   "'expanding': above (z >= 2); else 'typical'")]
    says: Annotated[str, Field(description="the finding in a sentence")]


class FamilyDepth(TypedDict):
    """One prompt family's means over its prompts (`lid`: per layer of the run, in order)."""

    family: str
    n_prompts: int
    convergence_index: Number
    curvature: Number
    path_length: Number
    lid: list[Number]


class FamilyTest(TypedDict):
    """Two families compared on one per-prompt metric: their means and the permutation p-value."""

    family_a: str
    family_b: str
    metric: str
    mean_a: Number
    mean_b: Number
    p_value: Number


@dataclass
class DepthRun(JsonResult):
    """A stored depth run. A corpus run: the per-layer `profile` (ID with its interval, local
    ID quantiles, trajectory means, logit and tuned lens), the `cka` matrix, the distributions
    of per-token trajectory metrics, the tokens with extreme trajectories and, with SAEs
    joined, the features firing where the representation compresses or expands most. A
    families run: the per-family means (`families`) and every pairwise test (`family_tests`). A
    pair run: the CKA of every layer of A against every layer of B (`cka`) and, where both are
    read at the same layers, the ID and local-ID shift from A to B (`shift`)."""

    run: str
    kind: DepthKind
    parameters: dict[str, Any]
    summary: dict[str, Any]
    layers: list[int]
    profile: list[DepthLayer] = field(default_factory=list)
    cka: CkaMatrix | None = None
    distributions: Annotated[dict[str, Distribution], Field(
        description="per-token convergence index, mean curvature and path length")] = field(default_factory=dict)
    extreme_tokens: list[ExtremeToken] = field(default_factory=list)
    features: Annotated[list[FeatureDepth], Field(
        description="per joined SAE, the features with the lowest and highest local-dimension z")] = field(
        default_factory=list)
    shift: Annotated[list[DepthShift], Field(description="a pair run's shift per layer (empty when the two "
                                                         "models are read at different layers)")] = field(
        default_factory=list)
    families: list[FamilyDepth] = field(default_factory=list)
    family_tests: Annotated[list[FamilyTest], Field(description="every family pair x metric, smallest p first")] = \
        field(default_factory=list)
    figures: list[FileName] = field(default_factory=list)

    def _repr_html_(self) -> str:
        s = self.summary
        if self.kind == "families":
            head = f"families {', '.join(escape(f['family']) for f in self.families)}"
        elif self.kind == "pair":
            head = f"{escape(self.parameters.get('model'))} vs {escape(self.parameters.get('model_b'))}"
        else:
            head = (f"{s.get('n_tokens')} tokens; ID peak at layer {s.get('id_peak_layer')}; lenses agree above "
                    f"50% from layer {s.get('logit_lens_first_layer_top1_above_half')} (logit), "
                    f"{s.get('tuned_lens_first_layer_top1_above_half')} (tuned)")
        rows = "".join(f"<tr><td>{r['layer']}</td><td>{format_value(r['twonn'])}</td><td>{format_value(r['mle'])}"
                       f"</td><td>{format_value(r['lid_q50'])}</td><td>{format_value(r['logit_top1'])}</td></tr>"
                       for r in self.profile)
        table = ("<table><tr><th>layer</th><th>TwoNN</th><th>MLE</th><th>LID median</th><th>logit top-1</th></tr>"
                 f"{rows}</table>") if rows else ""
        return f"<b>depth / {escape(self.run)}</b>: {head}{table}"
