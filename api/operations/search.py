"""The parameter layer of `search`; its other layers: `sae_atlas.api.commands.search` (CLI),
`sae_atlas.api.http.routers.search` (HTTP), `sae_atlas.api.results.search` (typed-result),
`sae_atlas.api.services.search` (service), `sae_atlas.store.search` (persistence).

The parameters of the searches that run the model: features firing on a text
(`Atlas.search_text`, `POST /search/text`, `sae-atlas search text`) and features separating
two sets of texts (`Atlas.contrast`, `POST /search/contrast`, `sae-atlas search contrast`);
and the lookups over the stored tables and indexes: nearest to a vector, by token, by label
words, by geometry, decoder neighbours and cross-layer flow (GET routes take them as query
parameters)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, Field

from sae_atlas.api.bounds import (
    MAX_INDEX,
    MAX_K,
    MAX_SAES_PER_QUERY,
    MAX_TEXT_CHARS,
    MAX_TEXTS,
    MAX_VECTOR,
)
from sae_atlas.api.operations.fields import JsonInt, SafeId, Text, integral
from sae_atlas.api.operations.operation import WHICH_SAES, Lookup, Operation
from sae_atlas.geometry.contrast import MAX_PERMUTATIONS


class TextSearchParams(Operation):
    """Which features fire on each token of `text`."""

    renamed = {"sae_ids": "saes"}

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="text to run through the model")
    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY, description=WHICH_SAES)
    k: JsonInt = Field(default=5, ge=1, le=MAX_K, description="features per token and SAE")
    include_special: bool = Field(default=False, description="keep BOS and the model's other special tokens")


class ContrastParams(Operation):
    """Which features separate the texts of `texts_a` from those of `texts_b`."""

    renamed = {"sae_ids": "saes"}

    texts_a: list[Text] = Field(min_length=2, max_length=MAX_TEXTS, description="first set of texts")
    texts_b: list[Text] = Field(min_length=2, max_length=MAX_TEXTS, description="second set of texts")
    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY, description=WHICH_SAES)
    k: JsonInt = Field(default=20, ge=1, le=MAX_K, description="features returned")
    pool: Literal["max", "mean"] = Field(default="max", description="pooling of a text's token activations")
    n_permutations: JsonInt = Field(default=20_000, ge=1, le=MAX_PERMUTATIONS,
                                    description="most permutations per feature (fewer where a p-value is clear)")
    alpha: float = Field(default=0.05, gt=0, lt=1, description="false discovery rate for 'significant'")
    duplicate_threshold: float = Field(default=0.9, ge=-1, le=1, description="decoder cosine of duplicates")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the permutations")


# searches over the stored tables and indexes (no model): query parameters over HTTP ------
def _one_or_many(value: Any) -> Any:
    """A single SAE id (the old `sae_id`) as a list of one."""
    return [value] if isinstance(value, str) else value


Saes = Annotated[Annotated[list[SafeId], Field(max_length=MAX_SAES_PER_QUERY)] | None, BeforeValidator(_one_or_many),
                 Field(description=WHICH_SAES)]
"""`saes` of the lookups; a single id (from the old `sae_id`) is a list of one."""
InCircle = Annotated[bool | None, Field(description="in a circle (true) or in none (false)")]
Period = Annotated[float | None, Field(gt=0, le=100_000, description="fitted period of the circle (within 0.5)")]
Lobe = Annotated[Annotated[int, Field(ge=0, le=2**31 - 1), BeforeValidator(integral)] | None,
                 Field(description="co-occurrence lobe")]
"""A lobe id (the bounds before the JSON-integer validator, so that the schema states them)."""


def _as_list(value: Any) -> Any:
    """An array-like direction (numpy, torch, a tuple) as a list of numbers; anything else
    unchanged (a JSON number or text stays what it is, and is refused)."""
    if isinstance(value, list | str | bytes | dict) or not hasattr(value, "__array__") and not isinstance(value, tuple):
        return value
    try:
        return np.asarray(value, dtype=np.float64).reshape(-1).tolist()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be a list of numbers ({exc})") from None


class VectorSearchParams(Operation):
    """Features whose decoder directions are nearest to `vector` (`Atlas.search_vector`,
    `POST /search/vector`, `sae-atlas search vector`)."""

    renamed = {"sae_id": "saes"}

    vector: Annotated[list[float], BeforeValidator(_as_list)] = Field(
        min_length=1, max_length=MAX_VECTOR, description="a direction of length d_in, not all zero",
        json_schema_extra={"contains": {"not": {"const": 0}}})
    saes: Saes = Field(default=None, description=f"{WHICH_SAES}: those of the vector's width")
    k: JsonInt = Field(default=10, ge=1, le=MAX_K, description="features returned")
    in_circle: InCircle = None
    period: Period = None
    lobe: Lobe = None


class TokenSearchOptions(Lookup):
    """Which SAEs and how many features per list (`GET /search/token/{token_id}`)."""

    renamed = {"sae_id": "saes"}

    saes: Saes = None
    k: JsonInt = Field(default=10, ge=1, le=MAX_K, description="features per list")


class TokenSearchParams(TokenSearchOptions):
    """Features whose top examples centre on a token and features that promote it
    (`Atlas.search_token`, `GET /search/token`, `sae-atlas search token`)."""

    token: Annotated[str, Field(min_length=1, max_length=256)] | Annotated[int, Field(ge=0, le=MAX_INDEX)] = Field(
        description="a token string as the tokenizer writes it, or (from Python and the CLI's --id) a token id")


class LabelSearchParams(Lookup):
    """Features whose labels or imported explanations match words (`Atlas.search_labels`,
    `GET /search/labels`, `sae-atlas search labels`)."""

    renamed = {"sae_id": "saes", "q": "query"}

    query: str = Field(min_length=1, max_length=500, pattern="[A-Za-z0-9]", examples=["weekday"],
                       description="words to look for (at least one letter or digit)")
    saes: Saes = None
    k: JsonInt = Field(default=10, ge=1, le=MAX_K, description="features returned")


class GeometrySearchParams(Lookup):
    """Features by the geometry records they belong to (`Atlas.geometry_features`,
    `GET /search/geometry`, `sae-atlas search geometry`)."""

    renamed = {"sae_id": "saes"}

    saes: Saes = None
    in_circle: InCircle = None
    period: Period = None
    lobe: Lobe = None
    kind: Literal["circle", "concept", "hierarchy", "lobe"] | None = Field(default=None,
                                                                          description="only records of this kind")


class SimilarParams(Lookup):
    """The latents of the same SAE with the nearest decoder directions (`Atlas.similar`,
    `GET /saes/{sae_id}/features/{index}/similar`, `sae-atlas search similar`)."""

    k: JsonInt = Field(default=10, ge=1, le=MAX_K, description="neighbours returned")


class FlowParams(Lookup):
    """The best matches of a feature in the model's other SAEs (`Atlas.flow`,
    `GET /saes/{sae_id}/features/{index}/flow`, `sae-atlas search flow`)."""

    k: JsonInt = Field(default=5, ge=1, le=MAX_K, description="matches per other SAE")
