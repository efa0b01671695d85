"""The parameters of the searches that run the model: features firing on a text
(`Atlas.search_text`, `POST /search/text`, `sae-atlas search text`) and features separating
two sets of texts (`Atlas.contrast`, `POST /search/contrast`, `sae-atlas search contrast`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sae_atlas.api.bounds import (
    MAX_K,
    MAX_SAES_PER_QUERY,
    MAX_TEXT_CHARS,
    MAX_TEXTS,
)
from sae_atlas.api.operations.base import WHICH_SAES, Operation
from sae_atlas.api.operations.fields import JsonInt, SafeId, Text
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
