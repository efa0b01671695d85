"""The parameter layer of `steering`; its other layers: `sae_atlas.api.http.routers.steering`
(HTTP), `sae_atlas.api.results.steering` (typed-result), `sae_atlas.api.services.steering`
(service), `sae_atlas.store.steering` (persistence).

The parameters of aimed steering: features ranked by their measured effect toward a
target (`Atlas.steering_features`, `POST /steering/search`, `GET /steering/search`,
`sae-atlas steering-search`) and the AxBench-style benchmark of steering directions
(`Atlas.steer_bench`, `sae-atlas steer-bench`), and the steering tables both read
(`Atlas.steering_scores`, `sae-atlas steering-scores`).

The defaults of the measurement (ratio, KL bound, prompts, candidates, combination) have
their one home in the core's `SearchParams` (`saes.intervene.steering_search`), read here;
the targets are validated here and handed to the core as its plain dataclasses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from sae_atlas.api.bounds import MAX_K, MAX_SAES_PER_QUERY
from sae_atlas.api.operations.fields import PY_WHITESPACE, Index, JsonInt, SafeId, Text
from sae_atlas.api.operations.operation import WHICH_SAES, Operation
from sae_atlas.saes.intervene.steer_bench import BenchParams
from sae_atlas.saes.intervene.steering_params import SteeringParams
from sae_atlas.saes.intervene.steering_prompts import (
    BUILTIN_CATEGORIES,
    MAX_PROMPT_CHARS,
    MAX_USER_PROMPTS,
    MIN_CONFIRM_PROMPTS,
    PROMPT_STYLES,
    PromptStyle,
    read_user_prompts,
)
from sae_atlas.saes.intervene.steering_search import (
    MAX_TARGET_TOKENS,
    MAX_TEXTS,
    ConceptTarget,
    ContrastTarget,
    SearchParams,
    SteeringTarget,
    SteerMode,
    TokenTarget,
)
from sae_atlas.saes.intervene.strength import MAX_KL_BOUND, MAX_RATIO

DEFAULTS = SearchParams()
"""The core's measurement defaults: the one home of the ratio, the KL bound, the prompt counts."""
TOKEN_DESCRIPTION = "a token as written in text (' Friday') or as the vocabulary spells it ('ĠFriday')"
TokenText = Annotated[str, Field(min_length=1, max_length=64, description=TOKEN_DESCRIPTION)]
Token = TokenText | Index
"""A target token: its text (one token of the vocabulary) or its id."""
BuiltinCategory = Literal[tuple(BUILTIN_CATEGORIES)]  # type: ignore[valid-type]
UserPrompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS, pattern=f"[^{PY_WHITESPACE}]",
                                  description="a prompt with at least one non-space character")]


class SteeringTokens(Operation):
    """Raise the probability of these next tokens (each one token of the vocabulary)."""

    kind: Literal["tokens"]
    tokens: list[Token] = Field(min_length=1, max_length=MAX_TARGET_TOKENS, description="token texts or ids")

    def core(self) -> SteeringTarget:
        """The core's target."""
        return TokenTarget(list(self.tokens))


class SteeringConcept(Operation):
    """Raise a concept's values as next tokens (the first token of each value)."""

    kind: Literal["concept"]
    concept: str | dict[str, Any] = Field(description="a built-in concept name (weekdays, months, colours) or a "
                                                      "concept of your own (values, templates)")

    def core(self) -> SteeringTarget:
        """The core's target."""
        return ConceptTarget(self.concept)


class SteeringContrast(Operation):
    """Steer toward texts A and away from texts B (the tokens over-represented in A)."""

    kind: Literal["contrast"]
    texts_a: list[Text] = Field(min_length=1, max_length=MAX_TEXTS)
    texts_b: list[Text] = Field(min_length=1, max_length=MAX_TEXTS)

    def core(self) -> SteeringTarget:
        """The core's target."""
        return ContrastTarget(list(self.texts_a), list(self.texts_b))


TargetSpec = Annotated[SteeringTokens | SteeringConcept | SteeringContrast, Field(discriminator="kind")]
Target = Token | list[Token] | TargetSpec
"""A steering target: a token, several tokens, or a target of several tokens, a concept or a contrast."""


def core_target(target: Token | list[Token] | SteeringTokens | SteeringConcept | SteeringContrast) -> SteeringTarget:
    """A validated target as the core's dataclass."""
    if isinstance(target, (str, int)):
        return TokenTarget([target])
    if isinstance(target, list):
        return TokenTarget(list(target))
    return target.core()


class CategorySpec(Operation):
    """A class of words of your own: its values and prompts that end where one is a plausible next word."""

    name: str = Field(default="custom", min_length=1, max_length=64)
    values: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(min_length=1, max_length=256)
    templates: list[UserPrompt] = Field(default_factory=list, max_length=64, description="in-context prompts")
    questions: list[UserPrompt] = Field(default_factory=list, max_length=64, description="question prompts")


class SteeringMeasure(Operation):
    """How steering is measured and on which prompts (shared by the search and the benchmark)."""

    renamed = {"sae_ids": "saes"}

    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                      description=f"{WHICH_SAES}: each needs its summaries and steering table")
    ratio: float = Field(default=DEFAULTS.ratio, gt=1, le=MAX_RATIO,
                         description="probability ratio of the target the calibrated strength must reach")
    kl_bound: float = Field(default=DEFAULTS.kl_bound, gt=0, le=MAX_KL_BOUND,
                            description="bound on the KL (nats) over the rest of the next-token distribution")
    n_prompts: JsonInt = Field(default=DEFAULTS.n_prompts, ge=1, le=256, description="held-out ranking prompts")
    candidates: JsonInt = Field(default=DEFAULTS.candidates, ge=1, le=512, description="candidates measured per SAE")
    confirm_prompts: JsonInt = Field(default=DEFAULTS.confirm_prompts, ge=0, le=256,
                                     json_schema_extra={"not": {"const": 1}},  # one prompt confirms nothing
                                     description=f"held-out neutral prompts the ranking is confirmed on (0, or "
                                                 f"{MIN_CONFIRM_PROMPTS} or more)")
    styles: list[PromptStyle] = Field(default=list(DEFAULTS.styles), min_length=1, max_length=len(PROMPT_STYLES),
                                      description="prompt styles ranked and confirmed on (default: all)")
    prompts: list[UserPrompt] = Field(default_factory=list, max_length=MAX_USER_PROMPTS,
                                      description="your own prompts (style user): half rank, half confirm; from "
                                                  "Python and the CLI also a file (one per line or a JSON list)")
    combine: JsonInt = Field(default=DEFAULTS.combine, ge=0, le=16,
                             description="features in the fitted sparse combination (0: none)")

    @model_validator(mode="after")
    def _confirmable(self) -> SteeringMeasure:
        if self.confirm_prompts == 1:
            raise ValueError(f"confirm_prompts: one prompt confirms nothing; give 0 or at least {MIN_CONFIRM_PROMPTS}")
        return self

    def search_params(self, **more: Any) -> SearchParams:
        """The core's parameters of this measurement (`more`: the rest)."""
        return SearchParams(ratio=self.ratio, kl_bound=self.kl_bound, n_prompts=self.n_prompts,
                            candidates=self.candidates, confirm_prompts=self.confirm_prompts,
                            styles=tuple(self.styles), combine=self.combine, **more).check()


class SteeringOptions(SteeringMeasure):
    """A steering search's options (everything but its target)."""

    k: JsonInt = Field(default=DEFAULTS.k, ge=1, le=MAX_K, description="features returned")
    mode: SteerMode = Field(default=DEFAULTS.mode, description="add the decoder row (steer) or clamp the latent")
    seed: Index | None = Field(default=None,
                               description="seed of the held-out prompts (default: one past the steering tables')")
    category: BuiltinCategory | CategorySpec | None = Field(
        default=None, description="the target's class for in-context prompts and siblings (default: the built-in "
                                  "one listing the token)")
    include_dead: bool = Field(default=DEFAULTS.include_dead,
                               description="also rank latents below the density floor, as directions")


class SteeringSearchParams(SteeringOptions):
    """Features ranked by their measured effect toward a target, with calibrated strengths."""

    target: Target = Field(description="a token, several tokens, or a target of several tokens, a concept or a "
                                       "contrast")

    def core_target(self) -> SteeringTarget:
        """The target as the core's dataclass."""
        return core_target(self.target)


class SteerBenchParams(SteeringMeasure):
    """An AxBench-style comparison of steering directions toward each target."""

    targets: list[Target] = Field(min_length=1, max_length=64, description="the targets, one benchmark row each")
    prompt_prefix: str = Field(default=BenchParams.prompt_prefix, min_length=1, max_length=MAX_PROMPT_CHARS,
                               description="prompting arm: text put before each prompt ({target}: the target)")

    def core_targets(self) -> list[SteeringTarget]:
        """The targets as the core's dataclasses."""
        return [core_target(t) for t in self.targets]


def user_prompts(prompts: Any) -> Any:
    """The user's prompts as Python and the CLI give them: a file (read) or a list (as is)."""
    return read_user_prompts(prompts) if isinstance(prompts, (str, Path)) else prompts


SCORES = SteeringParams()
"""The steering table's defaults (their one home: the core's `SteeringParams`)."""


class SteeringScoresParams(Operation):
    """Writes: per feature of each SAE, what steering with it at the last token of neutral
    prompts does to the next token (`saes/<id>/steering.parquet`, what a search reads)."""

    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                      description=f"{WHICH_SAES}: each needs its summaries")
    n_prompts: JsonInt = Field(default=SCORES.n_prompts, ge=1, le=4096, description="neutral prompts from the "
                                                                                    "built-in corpus")
    prompt_tokens: JsonInt = Field(default=SCORES.prompt_tokens, ge=2, le=1024,
                                   description="tokens per prompt (BOS included)")
    strength: float = Field(default=SCORES.strength, ge=-1e4, le=1e4, allow_inf_nan=False,
                            description="steering strength: alpha = strength x the feature's mean active value")
    seed: JsonInt = Field(default=SCORES.seed, ge=0, le=2**31 - 1, description="seed of the prompt draw")
    top_k: JsonInt = Field(default=SCORES.top_k, ge=1, le=1000, description="promoted and suppressed tokens kept "
                                                                            "per feature")
    chunk: JsonInt = Field(default=SCORES.chunk, ge=1, le=65536, description="features per batch and per "
                                                                             "resumable chunk")
    lens_z: float = Field(default=SCORES.lens_z, ge=0, le=1000, description="measure only live features whose "
                          "decoder's logit-lens peak has this z-score over the vocabulary (0: every feature)")
    force: bool = Field(default=False, description="recompute tables that are current (same parameters and weights)")

    def core(self) -> SteeringParams:
        """The core's parameters of a table."""
        return SteeringParams(n_prompts=self.n_prompts, prompt_tokens=self.prompt_tokens, seed=self.seed,
                              strength=self.strength, top_k=self.top_k, chunk=self.chunk, lens_z=self.lens_z)
