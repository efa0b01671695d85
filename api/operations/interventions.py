"""The parameter layer of `interventions`; its other layers:
`sae_atlas.api.http.routers.interventions` (HTTP), `sae_atlas.api.results.interventions`
(typed-result), `sae_atlas.api.services.interventions` (service).

The parameters of the interventions on the atlas's model: a forward pass with SAEs
spliced in and edits applied (`Atlas.run`, `POST /run`), a generation without and with
edits (`Atlas.steer`, `Atlas.steer_stream`, `POST /steer`, `POST /steer/stream`,
`sae-atlas steer`) and the attribution of a target to features (`Atlas.attribute`,
`POST /attribute`, `sae-atlas attribute`).

The edit specs and attribution targets are validated here (JSON bodies, Python dicts) and
handed to the core as its plain dataclasses (`saes.intervene.edits`, `.attribution`).
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from sae_atlas.api.bounds import (
    MAX_ATTRIBUTED,
    MAX_EDITS,
    MAX_NEW_TOKENS,
    MAX_NEXT_TOKENS,
    MAX_SAES_PER_QUERY,
    MAX_TEMPERATURE,
    MAX_VERIFIED,
)
from sae_atlas.api.operations.fields import Index, JsonInt, Prompt, SafeId, integral
from sae_atlas.api.operations.operation import WHICH_SAES, Operation
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene import attribution as core_attribution
from sae_atlas.saes.intervene import edits as core_edits

SPLICED = (f"{WHICH_SAES}: spliced into the model (error term kept, so they change its outputs only by float "
           "rounding), besides those the edits name")
"""What `saes` means for `run` and `steer` (the same default as everywhere: every SAE)."""


def _plain(value: Any) -> Any:
    """A core dataclass (an edit or target built in Python) as the dict it validates from."""
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


class TokenMatch(Operation):
    """Prompt positions whose token text, stripped of spaces, equals `match` stripped."""

    match: str = Field(min_length=1, max_length=200)


Position = Annotated[int, Field(ge=-4096, le=4096), BeforeValidator(integral)]
"""A prompt position (negative: from the end)."""
Positions = Literal["all", "last"] | list[Position] | TokenMatch


class _Edit(Operation):
    at: Positions = Field(default="all", description="every position (also generated ones), the last prompt "
                                                     "token, prompt positions (negative from the end), or the "
                                                     "prompt tokens matching a text")

    def core(self) -> core_edits.Edit:
        """The core's edit."""
        values = {name: getattr(self, name) for name in type(self).model_fields}
        if isinstance(self.at, TokenMatch):
            values["at"] = core_edits.TokenMatch(self.at.match)
        return CORE_EDITS[values["kind"]](**values)


class _FeatureEdit(_Edit):
    sae: SafeId = Field(description="SAE id")
    feature: JsonInt = Field(ge=0, le=2**31 - 1)


class SteerEdit(_FeatureEdit):
    """Add `alpha` x the feature's decoder row to the hook's output."""

    kind: Literal["steer"] = "steer"
    alpha: float = Field(allow_inf_nan=False)


class ClampEdit(_FeatureEdit):
    """Set the feature's activation to `value`."""

    kind: Literal["clamp"] = "clamp"
    value: float = Field(allow_inf_nan=False)


class ScaleEdit(_FeatureEdit):
    """Multiply the feature's activation by `factor`."""

    kind: Literal["scale"] = "scale"
    factor: float = Field(allow_inf_nan=False)


class AblateEdit(_FeatureEdit):
    """Set the feature's activation to zero, or to its mean over the atlas's tokens."""

    kind: Literal["ablate"] = "ablate"
    to: Literal["zero", "mean"] = "zero"


class ProjectOutEdit(_Edit):
    """Remove the span of several features' decoder rows from the hook's output."""

    kind: Literal["project_out"] = "project_out"
    sae: SafeId = Field(description="SAE id")
    features: list[Index] = Field(min_length=1, max_length=256)


class RotateEdit(_Edit):
    """Move the representation on a fitted circle plane by `steps` values."""

    kind: Literal["rotate"] = "rotate"
    circle: SafeId = Field(description="a stored `analyze circular concept` run")
    layer: Annotated[int, Field(ge=0, le=4096), BeforeValidator(integral)] | None = Field(
        default=None, description="probed layer (default: the run's best layer)")
    steps: JsonInt = Field(default=1, ge=-4096, le=4096)
    baseline: core_edits.RotateBaseline = "circle"
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1)


CORE_EDITS: dict[str, type] = {"steer": core_edits.SteerEdit, "clamp": core_edits.ClampEdit,
                               "scale": core_edits.ScaleEdit, "ablate": core_edits.AblateEdit,
                               "project_out": core_edits.ProjectOutEdit, "rotate": core_edits.RotateEdit}
Edit = Annotated[SteerEdit | ClampEdit | ScaleEdit | AblateEdit | ProjectOutEdit | RotateEdit,
                 Field(discriminator="kind"), BeforeValidator(_plain)]
Edits = Annotated[list[Edit], Field(max_length=MAX_EDITS, description="feature edits (kinds: steer, clamp, scale, "
                                                                      "ablate, project_out, rotate)")]

TokenRef = Annotated[str, Field(min_length=1, max_length=200)] | Index
"""A token: a string that is exactly one token, or an id."""
_NAMED = {"not": {"type": "null"}}
_TOKENS_BY_KIND = {"anyOf": [
    {"properties": {"kind": {"const": "loss"}}, "required": ["kind"]},
    {"properties": {"kind": {"const": "logit"}, "token": _NAMED}, "required": ["token"]},
    {"properties": {"kind": {"const": "logit_diff"}, "token": _NAMED, "other": _NAMED},
     "required": ["kind", "token", "other"]},
]}
"""`AttributionTarget`'s cross-field rule in its JSON schema: logit targets name `token`,
logit_diff targets also `other` (the rule itself is the core `Target`'s)."""


class AttributionTarget(Operation):
    """What to attribute: a token's logit, a logit difference `token - other`, or the
    mean next-token loss over the prompt. Logit targets read the prediction at `position`."""

    model_config = {**Operation.model_config, "json_schema_extra": _TOKENS_BY_KIND}
    kind: Literal["logit", "logit_diff", "loss"] = "logit"
    token: TokenRef | None = None
    other: TokenRef | None = None
    position: JsonInt = Field(default=-1, ge=-4096, le=4096)

    @model_validator(mode="after")
    def _tokens_named(self) -> AttributionTarget:
        try:
            self.core()
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from None
        return self

    def core(self) -> core_attribution.Target:
        """The core's target."""
        return core_attribution.Target(self.kind, self.token, self.other, self.position)


class _Spliced(Operation):
    renamed = {"sae_ids": "saes"}

    text: Prompt
    edits: Edits = Field(default_factory=list)
    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY, description=SPLICED)

    def core_edits(self) -> list[core_edits.Edit]:
        """The edits as the core's."""
        return [edit.core() for edit in self.edits]


class RunParams(_Spliced):
    """A forward pass with SAEs spliced in (their feature activations listed) and edits applied."""

    k: JsonInt = Field(default=10, ge=1, le=MAX_NEXT_TOKENS, description="next tokens to list")


_ONE_SAE = {"type": "array", "minItems": 1, "maxItems": 1}
_SOMETHING_TO_DO = {"allOf": [
    {"anyOf": [{"properties": {"edits": {"minItems": 1}}, "required": ["edits"]},
               {"properties": {"feature": {"type": "integer"}, "saes": _ONE_SAE}, "required": ["feature", "saes"]}]},
    {"anyOf": [{"not": {"required": ["feature"]}}, {"properties": {"feature": {"type": "null"}}},
               {"properties": {"saes": _ONE_SAE}, "required": ["saes"]}]},
]}
"""`SteerParams`' cross-field rules in its JSON schema: an edit or a feature, and a feature
with exactly one SAE."""


class SteerParams(_Spliced):
    """Baseline vs edited generation with one seed: the edits, and (with `feature`) a steer of
    one feature of the one SAE in `saes`."""

    model_config = {**Operation.model_config, "json_schema_extra": _SOMETHING_TO_DO}
    renamed = {"sae_ids": "saes", "sae": "saes"}

    feature: Index | None = Field(default=None, description="a feature of the one SAE in saes to steer with "
                                                            "(besides the edits)")
    alpha: float = Field(default=4.0, allow_inf_nan=False, description="the feature's steering strength: alpha x "
                                                                       "its decoder row")
    at: Literal["all", "last"] = Field(default="all", description="positions of the feature's steer")
    max_new_tokens: JsonInt = Field(default=20, ge=1, le=MAX_NEW_TOKENS, description="tokens to generate")
    temperature: float = Field(default=0.0, ge=0.0, le=MAX_TEMPERATURE, description="0: greedy; >0: sampled")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of sampling")

    @model_validator(mode="after")
    def _something_to_do(self) -> SteerParams:
        if self.feature is not None and len(self.saes or []) != 1:
            raise ValueError("feature: a feature steers with the one SAE in saes; give exactly one")
        if not self.edits and self.feature is None:
            raise ValueError("edits: steer needs at least one edit (or a feature of the one SAE in saes)")
        return self

    def core_edits(self) -> list[core_edits.Edit]:
        """The edits as the core's, the feature's steer first."""
        edits = super().core_edits()
        if self.feature is not None and self.saes:
            edits.insert(0, core_edits.SteerEdit(sae=self.saes[0], feature=self.feature, alpha=self.alpha, at=self.at))
        return edits


class AttributeParams(Operation):
    """Feature attribution of a target on the prompt."""

    renamed = {"sae_ids": "saes"}

    text: Prompt
    target: Annotated[AttributionTarget | TokenRef, BeforeValidator(_plain)] = Field(
        description="a token (its logit at the last position) or a target")
    saes: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                      description=f"{WHICH_SAES}: attributed to")
    top: JsonInt = Field(default=20, ge=1, le=MAX_ATTRIBUTED, description="features listed")
    verify: JsonInt = Field(default=5, ge=0, le=MAX_VERIFIED, description="top features checked by true ablation")
    mode: core_attribution.AttributionMode = Field(
        default="linearized", description="linearized: parts sum to the target; gradient: the model's own gradient")

    def core_target(self) -> core_attribution.Target:
        """The target as the core's (a token: its logit at the last position)."""
        if isinstance(self.target, AttributionTarget):
            return self.target.core()
        return core_attribution.Target("logit", self.target)
