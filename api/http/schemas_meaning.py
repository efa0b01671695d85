"""The HTTP contract of the meaning searches (contrast, concept search, label search):
request bodies with the limits that keep one request bounded, and the answers only the
service sends (geometry and label hits); the results are `api.results.meaning`'s."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field

from sae_atlas.api.bounds import (
    MAX_HTTP_PERMUTATIONS,
    MAX_SAES_PER_QUERY,
    MAX_TEXTS_PER_SET,
)
from sae_atlas.api.http.schemas import JsonInt, SafeId, _Strict
from sae_atlas.api.operations.fields import Text
from sae_atlas.api.operations.search import ContrastParams
from sae_atlas.api.results.feature import GeometryRecord


class ContrastQuery(ContrastParams):
    """Which features separate the texts of `texts_a` from those of `texts_b`
    (`api.operations.search.ContrastParams`, with fewer texts and permutations than Python
    takes so that one request stays cheap; the old field name `sae_ids` is still accepted)."""

    texts_a: list[Text] = Field(min_length=2, max_length=MAX_TEXTS_PER_SET, description="first set of texts")
    texts_b: list[Text] = Field(min_length=2, max_length=MAX_TEXTS_PER_SET, description="second set of texts")
    n_permutations: JsonInt = Field(default=ContrastParams.default("n_permutations"), ge=100,
                                    le=MAX_HTTP_PERMUTATIONS,
                                    description="most permutations per feature (fewer where a p-value is clear)")


def _distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("concept values must be distinct")
    return values


ConceptValue = Annotated[str, Field(min_length=1, max_length=64, pattern="[A-Za-z0-9]",
                                    description="a value (at least one letter or digit)")]
ConceptTemplate = Annotated[str, Field(min_length=7, max_length=256, pattern=r"^[^{}]*\{value\}[^{}]*$",
                                       description="a prompt with exactly one {value} slot and no other braces")]


def _values(minimum: int) -> object:
    return Field(min_length=minimum, max_length=64, json_schema_extra={"uniqueItems": True},
                 description="distinct values")


class OrderedConceptSpec(_Strict):
    """Your own ordered (cyclic) concept: values in order and prompt templates."""

    kind: Literal["ordered"]
    name: str = Field(default="custom", max_length=64)
    values: Annotated[list[ConceptValue], AfterValidator(_distinct)] = _values(3)
    templates: list[ConceptTemplate] = Field(min_length=1, max_length=16)


class CategoryConceptSpec(_Strict):
    """Your own unordered concept (categories) and prompt templates."""

    kind: Literal["categories"]
    name: str = Field(default="custom", max_length=64)
    values: Annotated[list[ConceptValue], AfterValidator(_distinct)] = _values(2)
    templates: list[ConceptTemplate] = Field(min_length=1, max_length=16)


ConceptSpec = Annotated[OrderedConceptSpec | CategoryConceptSpec, Field(discriminator="kind")]


class ConceptQuery(_Strict):
    """Which features carry a concept, and which few span it."""

    concept: Literal["weekdays", "months", "colours"] | ConceptSpec = Field(
        description="a built-in concept name or a concept of your own")
    sae_ids: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                         description="SAEs to search (default: all)")
    min_fire_rate: float = Field(default=0.5, gt=0, le=1, description="share of a value's prompts a feature fires on")
    min_selectivity: float = Field(default=0.5, gt=0, le=1, description="share of variance the value explains")
    target: float = Field(default=0.9, gt=0, le=1, description="explained variance at which the span stops")
    max_features: JsonInt = Field(default=8, ge=1, le=32)
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1)


class GeometryFeature(GeometryRecord):
    """A geometry record with its SAE."""

    sae_id: str


class LabelHit(BaseModel):
    """A label-search hit (BM25 over the offline label and the imported explanations)."""

    sae_id: str
    latent: int
    score: float
    label: str | None
    explanations: list[str]
