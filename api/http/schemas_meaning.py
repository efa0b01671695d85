"""The HTTP contract of the meaning searches (contrast, concept search, label search):
request bodies with the limits that keep one request bounded, and typed responses."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictInt

from api.atlas import MAX_K, MAX_TEXT_CHARS
from api.http.schemas import MAX_SAES_PER_QUERY, Number, _Strict

MAX_TEXTS_PER_SET = 256
MAX_PERMUTATIONS = 100_000
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]


class ContrastQuery(_Strict):
    """Which features separate the texts of `texts_a` from those of `texts_b`."""

    texts_a: list[Text] = Field(min_length=2, max_length=MAX_TEXTS_PER_SET, description="first set of texts")
    texts_b: list[Text] = Field(min_length=2, max_length=MAX_TEXTS_PER_SET, description="second set of texts")
    sae_ids: list[str] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                      description="SAEs to encode with (default: all)")
    k: StrictInt = Field(default=20, ge=1, le=MAX_K, description="features returned")
    pool: Literal["max", "mean"] = Field(default="max", description="pooling of a text's token activations")
    n_permutations: StrictInt = Field(default=20_000, ge=100, le=MAX_PERMUTATIONS)
    alpha: float = Field(default=0.05, gt=0, lt=1, description="false discovery rate for 'significant'")
    duplicate_threshold: float = Field(default=0.9, ge=-1, le=1, description="decoder cosine of duplicates")
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1)


class ContrastFeature(BaseModel):
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


class ContrastResult(BaseModel):
    """Features separating two sets of texts (q-values: Benjamini-Hochberg over every
    tested feature; `n_tested`: per SAE, the features active on some text)."""

    n_a: int
    n_b: int
    pool: str
    n_permutations: int
    alpha: float
    duplicate_threshold: float
    n_tested: dict[str, int]
    n_significant: int
    features: list[ContrastFeature]
