"""The concept search's parameters (`Atlas.concept_search`, `POST /search/concept`,
`sae-atlas search concept`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sae_atlas.api.bounds import MAX_SAES_PER_QUERY, MAX_SPAN
from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import WHICH_SAES, Operation


class ConceptSearchQuery(Operation):
    """Which features carry a concept, and which few span it (what reads only)."""

    renamed = {"sae_ids": "saes"}

    concept: Any = Field(description="a built-in concept name (weekdays, months, colours), a concept of your own "
                                     "(kind, values, templates; from Python also a JSON file or a concept object)")
    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY, description=WHICH_SAES)
    min_fire_rate: float = Field(default=0.5, gt=0, le=1, description="share of a value's prompts a feature fires on")
    min_selectivity: float = Field(default=0.5, gt=0, le=1, description="share of variance the value explains")
    target: float = Field(default=0.9, gt=0, le=1, description="explained variance at which the span stops")
    max_features: JsonInt = Field(default=8, ge=1, le=MAX_SPAN, description="largest span")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the held-out split")


class ConceptSearchParams(ConceptSearchQuery):
    """A concept search, and whether to store it (Python and the CLI; a server does not write)."""

    save: SafeId | None = Field(default=None, description="writes: store the result as analysis run "
                                                          "concept_search/<save> and rebuild the geometry records")
