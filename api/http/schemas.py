"""The HTTP contract: request bodies (with the limits that keep one request cheap) and the
answers only the service sends (errors, health, pages of tables). The results of the
Atlas (`api.results`), their row types included, are their own response models.

Handlers render bodies with `json_body` (orjson) rather than through these models, so the
models must say exactly what is sent: floats that may be NaN are nullable (NaN is sent as
`null`). `tests/api/test_fuzz.py` checks live answers against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from sae_atlas.api.operations.analyses import CircularParams
from sae_atlas.api.operations.fields import JsonInt, integral
from sae_atlas.api.operations.search import TextSearchParams, VectorSearchParams
from sae_atlas.api.results.feature import FeatureRow


def json_strict(annotation: Any) -> Any:
    """`annotation` validated as request bodies are (`_Strict`, `JsonInt`) down to the
    fields of the models it holds, which pydantic validates by their own, lax,
    configuration: `true` is not 1 and `3.0` is 3 there too."""
    adapter = TypeAdapter(annotation)
    return Annotated[annotation, BeforeValidator(lambda value: adapter.validate_python(integral(value), strict=True))]


class _Strict(BaseModel):
    """A request body: unknown fields rejected, no type coercion (`true` is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# requests ------------------------------------------------------------------------------
class TextQuery(TextSearchParams):
    """Which features fire on each token of `text` (`api.operations.search.TextSearchParams`;
    the old field name `sae_ids` is still accepted)."""


class VectorQuery(VectorSearchParams):
    """Features whose decoder directions are nearest to `vector`
    (`api.operations.search.VectorSearchParams`; the old field name `sae_id` is still accepted)."""


class CircularRequest(CircularParams):
    """Run circular-feature discovery on one SAE (needs `--allow-analyses`;
    `api.operations.analyses.CircularParams`, the tokens encoded bounded for a server)."""

    max_tokens: JsonInt = Field(default=CircularParams.default("max_tokens"), ge=256, le=1_000_000,
                                description="cached tokens to encode")


# responses -----------------------------------------------------------------------------
class ErrorBody(BaseModel):
    """Every error: its kind (`validation`, `http`, `NotFoundError`, `InvalidInputError`,
    `integrity`, `internal`) and what was wrong; integrity errors add the file and the repair."""

    error: str
    detail: str
    path: str | None = Field(default=None, description="integrity errors: the damaged file, atlas-relative")
    repair: str | None = Field(default=None, description="integrity errors: the command that rebuilds it")


class Health(BaseModel):
    """Liveness. Without a token (when the server has one) only `status` is sent."""

    status: Literal["ok"]
    saes: int | None = Field(default=None, description="SAEs served")
    worker_pid: int | None = None
    auth: bool | None = Field(default=None, description="whether data endpoints need a bearer token")
    analyses_allowed: bool | None = None
    interventions_allowed: bool | None = Field(
        default=None, description="whether the model may run (POST /run, /steer, /attribute, /graph, /steering/search)")
    damaged_saes: dict[str, str] | None = Field(
        default=None, description="SAEs not served because a file is damaged: SAE id -> the file and its repair")
    unregistered_saes: dict[str, str] | None = Field(
        default=None, description="SAE folders atlas.json does not list (served, marked 'unregistered' in /saes): "
                                  "SAE id -> the command that registers it again")
    unregistered_analyses: dict[str, str] | None = Field(
        default=None, description="analysis runs on disk their kind's runs.json does not list (not served): "
                                  "'KIND/RUN' -> the command that registers it again")


class FeaturePage(BaseModel):
    """A page of the per-latent table."""

    total: int
    offset: int
    rows: list[FeatureRow]
