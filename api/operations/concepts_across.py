"""The parameters of the concept analyses across SAEs: where concepts emerge over a series
(`Atlas.emergence`, `sae-atlas emergence`) and whether a circle of A exists in B
(`Atlas.compare_circle`, `sae-atlas compare-circle`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import Operation
from sae_atlas.geometry.emergence_options import DEFAULT_CONCEPTS, Metric


class EmergenceParams(Operation):
    """Per concept, at which member of a series of SAEs its features first reach a threshold."""

    concepts: list[Any] = Field(default_factory=lambda: list(DEFAULT_CONCEPTS), min_length=1,
                                description="built-in names (weekdays, months, numbers, colours), dicts or JSON "
                                            "files as concept search takes, or concept objects")
    metric: Metric = Field(default="auroc", description="the score the threshold applies to")
    threshold: float = Field(default=0.9, description="a member 'has' the concept when its score reaches this")
    test_frac: float = Field(default=0.25, gt=0, lt=1, description="held-out share of the prompts")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the train / held-out split")
    run: SafeId | None = Field(default=None, description="run name (default <concepts>--<saes>)")


class CircleTransferParams(Operation):
    """Does the circle of A's stored concept run exist in B?"""

    circle: str = Field(min_length=1, max_length=300, description="A's stored run: circular/<run> (a concept run) "
                                                                  "or concept_search/<run> (an ordered concept)")
    model_b: str | None = Field(default=None, description="look in this model's activations instead of an atlas (a "
                                                          "Hugging Face id or folder, a .gguf, tiny JSON)")
    hook_b: str | None = Field(default=None, description="with model_b: the hook (default A's SAE's hook)")
    n_components: JsonInt = Field(default=5, ge=2, description="principal components fed to the circle probe")
    n_null: JsonInt = Field(default=200, ge=1, description="relabelled-value draws of the probe nulls")
    n_random: JsonInt = Field(default=50, ge=0, description="random-direction spans of the span null")
    alpha: float = Field(default=0.05, gt=0, lt=1, description="p-value at which B counts as holding the circle")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the nulls")
    run: SafeId | None = Field(default=None, description="run name (default <concept>-<sae_a>--<B>)")
