"""Request bodies of the HTTP service, with the limits that keep one request cheap."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from api.atlas import MAX_K, MAX_TEXT_CHARS

MAX_VECTOR = 65536
MAX_SAES_PER_QUERY = 64
SAE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextQuery(_Strict):
    """Which features fire on each token of `text`."""

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="text to run through the model")
    sae_ids: list[str] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                      description="SAEs to encode with (default: all)")
    k: int = Field(default=5, ge=1, le=MAX_K, description="features per token and SAE")


class VectorQuery(_Strict):
    """Features whose decoder directions are nearest to `vector`."""

    vector: list[float] = Field(min_length=1, max_length=MAX_VECTOR, description="a direction of length d_in")
    sae_id: str | None = Field(default=None, description="one SAE (default: all SAEs of that width)")
    k: int = Field(default=10, ge=1, le=MAX_K)


class CircularRequest(_Strict):
    """Run circular-feature discovery on one SAE (needs `--allow-analyses`)."""

    max_tokens: int = Field(default=20_000, ge=256, le=1_000_000)
