"""The typed-result layer of `meaning`; its other layers: `sae_atlas.api.http.routers.meaning`
(HTTP), `sae_atlas.api.services.meaning` (service).

Results of the meaning searches: `ContrastResult` (features separating two sets of
texts) and `ConceptResult` (concept search), with their row types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field
from typing_extensions import NotRequired, TypedDict

from sae_atlas.api.results.feature import GeometryRecord
from sae_atlas.api.results.jsonable import to_jsonable
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.wire import JsonResult, Number


class GeometryFeature(GeometryRecord):
    """A geometry record with its SAE (`Atlas.geometry_features` rows)."""

    sae_id: str


class LabelHit(TypedDict):
    """A label-search hit (BM25 over the offline label and the imported explanations)."""

    sae_id: str
    latent: int
    score: float
    label: str | None
    explanations: list[str]


class ContrastFeature(TypedDict):
    """One feature of a contrast, best first; `group` is the rank of the first feature of
    its near-duplicate group."""

    rank: int
    sae_id: str
    hook: str
    latent: int
    mean_a: Number
    mean_b: Number
    diff: Number
    auroc: Number
    effect_size: Number
    p_value: Number
    q_value: Number
    significant: bool
    group: int
    label: NotRequired[str | None]


@dataclass
class ContrastResult(JsonResult):
    """Features that separate text set A from set B, best first (see `Atlas.contrast`).

    `table` (sent as `features`): rows of rank, sae_id, hook, latent, mean_a, mean_b, diff,
    auroc, effect_size, p_value, q_value (Benjamini-Hochberg over every tested feature of
    every SAE), significant, group (the rank of the first row of its near-duplicate group)."""

    n_a: int
    n_b: int
    pool: str
    n_permutations: int
    alpha: float
    duplicate_threshold: float
    n_tested: Annotated[dict[str, int], Field(
        description="per SAE: the features active on some text (the ones tested)")]
    n_significant: Annotated[int, Field(description="over all SAEs, the features with q <= alpha")]
    table: Annotated[Rows[ContrastFeature], Field(serialization_alias="features")]

    def _repr_html_(self) -> str:
        return (f"<b>contrast</b> A: {self.n_a} texts, B: {self.n_b} texts; {self.n_significant} features "
                f"with q &le; {self.alpha}{self.table.frame._repr_html_()}")


class ConceptFeature(TypedDict):
    """A feature firing on the concept tokens; `span_order` is its place in the span (null: not in it)."""

    sae_id: str
    hook: str
    latent: int
    selective: bool
    selectivity: Number
    fire_rate: Number
    mean_act: Number
    value: str
    span_order: int | None
    label: NotRequired[str | None]


class ConceptSaeSummary(TypedDict):
    """One SAE's answer: the span (latents in the order chosen), cumulative explained
    variance, and the span's geometry fit (circle probe fields for an ordered concept,
    `lda_accuracy` and `chance` for categories, `note` when the span is too small)."""

    hook: str
    kind: str
    n_features: int
    n_selective: int
    span: list[int]
    explained: list[Number]
    fit: dict[str, Any]
    score: Number


@dataclass
class ConceptResult(JsonResult):
    """Concept search over one or more SAEs (see `Atlas.concept_search`): per SAE the
    features that fire on the concept tokens, the smallest feature group spanning the
    concept's variation and the geometry fit of that span; `best` names the SAE whose span
    fits best on held-out prompts."""

    concept: dict[str, Any]
    kind: str
    per_sae: dict[str, ConceptSaeSummary]
    best: str
    features: Rows[ConceptFeature] = field(default_factory=lambda: Rows.of(ConceptFeature, []))

    def _repr_html_(self) -> str:
        best = self.per_sae[self.best]
        return (f"<b>concept {self.concept.get('name')}</b> ({self.kind}); best SAE {self.best}: "
                f"span {best['span']} fit {to_jsonable(best['fit'])}{self.features.frame.head(20)._repr_html_()}")
