"""The HTTP contract of the meaning searches (contrast, concept search, label search):
request bodies with the limits that keep one request bounded; the results, geometry and
label hits included, are `api.results.meaning`'s."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from sae_atlas.api.bounds import (
    MAX_HTTP_PERMUTATIONS,
    MAX_TEXTS_PER_SET,
)
from sae_atlas.api.http.schemas import JsonInt, _Strict
from sae_atlas.api.operations.concept import ConceptSearchQuery
from sae_atlas.api.operations.fields import Text
from sae_atlas.api.operations.search import ContrastParams


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


class ConceptQuery(ConceptSearchQuery):
    """Which features carry a concept, and which few span it
    (`api.operations.concept.ConceptSearchQuery`: a built-in name or a concept given inline,
    never a file of the server; the old field name `sae_ids` is still accepted)."""

    concept: Literal["weekdays", "months", "colours"] | ConceptSpec = Field(
        description="a built-in concept name or a concept of your own")
