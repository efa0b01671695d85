"""The HTTP contract: request bodies (with the limits that keep one request cheap) and the
typed response models that `/openapi.json` publishes.

Handlers render bodies with `json_body` (orjson) rather than through these models, so the
models must say exactly what is sent: floats that may be NaN are nullable (NaN is sent as
`null`), and tables whose columns vary by analysis are open objects.
`tests/api/test_fuzz.py` checks live answers against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from api.atlas import MAX_K, MAX_TEXT_CHARS
from geometry.maps import Basis

MAX_VECTOR = 65536
MAX_SAES_PER_QUERY = 64
ID_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
"""`store.layout.check_id` as a JSON-schema pattern (with maxLength 128): a letter or digit,
then letters, digits, '.', '_' or '-', never '..'."""
Number = float | None  # NaN and infinities are sent as null


def _integral(value: Any) -> Any:
    """A JSON number with no fraction (`3.0`) as an int; anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


JsonInt = Annotated[int, BeforeValidator(_integral)]
"""An integer as JSON Schema means it: `3` or `3.0`, never `true` or `"3"` (with `_Strict`)."""
SafeId = Annotated[str, Field(max_length=128, pattern=ID_PATTERN)]


class _Strict(BaseModel):
    """A request body: unknown fields rejected, no type coercion (`true` is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# requests ------------------------------------------------------------------------------
class TextQuery(_Strict):
    """Which features fire on each token of `text`."""

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="text to run through the model")
    sae_ids: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                         description="SAEs to encode with (default: all)")
    k: JsonInt = Field(default=5, ge=1, le=MAX_K, description="features per token and SAE")


class VectorQuery(_Strict):
    """Features whose decoder directions are nearest to `vector`."""

    vector: list[float] = Field(min_length=1, max_length=MAX_VECTOR,
                                description="a direction of length d_in, not all zero",
                                json_schema_extra={"contains": {"not": {"const": 0}}})
    sae_id: SafeId | None = Field(default=None, description="one SAE (default: all SAEs of that width)")
    k: JsonInt = Field(default=10, ge=1, le=MAX_K)


class CircularRequest(_Strict):
    """Run circular-feature discovery on one SAE (needs `--allow-analyses`)."""

    sae_id: SafeId
    max_tokens: JsonInt = Field(default=20_000, ge=256, le=1_000_000)


# responses -----------------------------------------------------------------------------
class ErrorBody(BaseModel):
    """Every error: its kind (`validation`, `http`, `NotFoundError`, `InvalidInputError`,
    `integrity`, `internal`) and what was wrong; integrity errors add the file and the repair."""

    error: str
    detail: str
    path: str | None = Field(default=None, description="integrity errors: the damaged file, atlas-relative")
    repair: str | None = Field(default=None, description="integrity errors: the command that rebuilds it")


class Health(BaseModel):
    """Liveness. Without a token (when the server has one) only `status` is sent."""

    status: Literal["ok"]
    saes: int | None = Field(default=None, description="SAEs served")
    worker_pid: int | None = None
    auth: bool | None = Field(default=None, description="whether data endpoints need a bearer token")
    analyses_allowed: bool | None = None
    damaged_saes: dict[str, str] | None = Field(
        default=None, description="SAEs not served because a file is damaged: SAE id -> the file and its repair")


class SaeInfo(BaseModel):
    """One SAE: its hook, architecture, widths and the held-out metrics recorded at training."""

    sae_id: str
    hook: str | None
    architecture: str | None
    d_in: int | None
    d_sae: int | None
    k: int | None
    fvu: Number
    l0: Number
    dead_fraction: Number
    source: str = Field(default="trained", description="'trained', or the SOURCE it was imported from")
    suspect: bool = Field(default=False, description="imported with --force despite the misload guard")
    status: Literal["ok", "damaged"] = Field(
        default="ok", description="'damaged': a file of the SAE is missing, truncated or corrupt; its pages "
        "answer 500 naming it")
    problem: str | None = Field(default=None, description="for a damaged SAE: the file, what is wrong, the repair")


class FeatureRow(BaseModel):
    """One row of the per-latent table."""

    latent: int
    n_active: int
    density: Number
    mean_act: Number
    mean_active_act: Number
    max_act: Number


class FeaturePage(BaseModel):
    """A page of the per-latent table."""

    total: int
    offset: int
    rows: list[FeatureRow]


class FeatureStats(BaseModel):
    """Activation statistics of one latent; `quantiles` maps a level ("0.5") to a value."""

    n_active: int
    density: Number
    mean_act: Number
    mean_active_act: Number
    max_act: Number
    decoder_norm: Number
    quantiles: dict[str, Number]


class Histogram(BaseModel):
    """Activation histogram: bin `edges` (n+2, the first 0) and `counts` (n+1)."""

    edges: list[Number]
    counts: list[int]


class ExampleContext(BaseModel):
    """A top example on a feature page: the window's tokens and activations."""

    act: Number
    block: int
    pos: int
    centre: int
    tokens: list[str | None]
    acts: list[Number]


class StoredExample(ExampleContext):
    """A stored example (top-k or an activation band) with its token ids and source."""

    latent: int
    kind: Literal["top", "band"]
    band: int | None
    band_lo: Number
    band_hi: Number
    rank: int
    token_id: int
    doc_id: int | None
    token_ids: list[int]


class LogitEffect(BaseModel):
    """A token the feature's decoder direction promotes or suppresses."""

    token_id: int
    token: str | None
    value: Number


class Match(BaseModel):
    """A search hit: a latent and the cosine of its decoder direction."""

    sae_id: str
    latent: int
    cosine: Number
    rank: int
    layer: int
    label: str | None = Field(default=None, description="the latent's offline label")
    explanations: list[str] | None = Field(default=None, description="imported explanations")


class MapPosition(BaseModel):
    """A latent's place on its SAE's 2-D map (label columns such as `cluster` when present)."""

    model_config = ConfigDict(extra="allow")

    latent: int
    x: Number
    y: Number
    knn_overlap: Number


class GeometryRecord(BaseModel):
    """A geometry result a feature belongs to: a circle (`circle`: discovered cluster;
    `concept`: selective feature of a concept search), a hierarchy node or a lobe."""

    latent: int
    kind: str
    run: str
    group: int | None = Field(description="cluster id, lobe id, or place in the concept's span")
    name: str | None
    in_circle: bool
    period: Number = Field(description="fitted period of the circle (null: not measured)")
    score: Number


class Feature(BaseModel):
    """A feature page; `neighbours`/`cross_layer` are null before `sae-atlas index`,
    `map_position` before `sae-atlas analyze map`."""

    sae_id: str
    index: int
    hook: str
    stats: FeatureStats
    histogram: Histogram
    examples: list[ExampleContext]
    top_logits: list[LogitEffect]
    bottom_logits: list[LogitEffect]
    neighbours: list[Match] | None
    cross_layer: list[Match] | None
    map_position: MapPosition | None
    damaged_saes: dict[str, str] | None = Field(
        default=None, description="damaged SAEs left out of cross_layer: SAE id -> the damaged file and its repair")
    geometry: list[GeometryRecord] = Field(default_factory=list,
                                           description="the geometry results the feature belongs to")
    label: str | None = Field(default=None, description="offline label computed from the feature's statistics")
    explanations: list[str] | None = Field(default=None, description="imported explanations")


class MapScore(BaseModel):
    """How faithful one map basis is: the mean share of each feature's k nearest neighbours
    in that basis kept among its k nearest on the map, the chance level, and the mean share
    of the other basis' neighbours the map keeps (null: not measured)."""

    knn_overlap_mean: Number
    chance: Number
    other_basis_overlap_mean: Number


class MapColumns(BaseModel):
    """A 2-D map in one basis as columns of equal length (label columns such as `cluster`
    when present), with the kNN-overlap scores of every basis built for the SAE."""

    model_config = ConfigDict(extra="allow")

    basis: Basis = Field(description="decoder: UMAP of the decoder rows; cooccurrence: of the co-occurrence graph")
    scores: dict[Basis, MapScore] = Field(description="per built basis, how well its map keeps neighbourhoods")
    latent: list[int]
    x: list[Number]
    y: list[Number]
    knn_overlap: list[Number]


class TokenActivation(BaseModel):
    """A feature active on a token."""

    latent: int
    act: Number


class TextSearch(BaseModel):
    """Per SAE, per token: the most active features."""

    text: str
    token_ids: list[int]
    tokens: list[str | None]
    features: dict[str, list[list[TokenActivation]]]


class CentredLatent(BaseModel):
    """A latent whose top examples centre on the token."""

    latent: int
    n_examples: int
    max_act: Number
    sae_id: str


class PromotingLatent(BaseModel):
    """A latent whose logit effects promote the token."""

    latent: int
    logit: Number
    sae_id: str


class TokenSearch(BaseModel):
    """Features tied to one token (`token` is null when asked by id)."""

    token: str | None
    token_id: int
    centred: list[CentredLatent]
    promoting: list[PromotingLatent]


class AnalysisRunFiles(BaseModel):
    """A stored analysis run and its files; a `damaged` run names the bad file and the repair."""

    kind: str
    run: str
    table: str | None
    figures: list[str]
    status: Literal["ok", "damaged"]
    problem: str | None = Field(description="for a damaged run: the file, what is wrong, the repair")


class Analysis(BaseModel):
    """One analysis result: its JSON (parameters, summary), main table (first 1000 rows) and figures."""

    kind: str
    run: str
    meta: dict[str, Any]
    columns: list[str] | None
    rows: list[dict[str, Any]] | None
    n_rows: int
    figures: list[str]
