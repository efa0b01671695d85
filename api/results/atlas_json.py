"""`AtlasMeta`: atlas.json as `Atlas.meta` returns it (the model, its hooks and corpus, and a
record per SAE and cross-layer transcoder). Keys are optional: an atlas being built has none
yet, and an older atlas.json may lack some."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from typing_extensions import TypedDict

from sae_atlas.api.results.wire import Number


class SaeRecord(TypedDict, total=False):
    """What atlas.json records of one SAE (`saes[sae_id]`): its hook, architecture, widths,
    training size and the held-out metrics; an imported SAE adds `source` and `suspect`."""

    sae_id: str
    hook: str
    hook_out: str | None
    architecture: str
    d_in: int
    d_sae: int
    k: int | None
    tokens: int
    input_scale: Number
    train_fvu: Number
    train_l0: Number
    fvu: Number
    l0: Number
    dead_fraction: Number
    source: dict[str, Any]
    suspect: bool


class AtlasMeta(TypedDict, total=False):
    """atlas.json: the model (a name or a spec), its layers and width, the corpus, the hooks
    cached, the versions that wrote it, and the SAEs and cross-layer transcoders registered."""

    model: Annotated[str | dict[str, Any], Field(description="the model's name or spec (`saes.models`)")]
    model_name: str
    n_layers: int
    d_model: int
    corpus: dict[str, Any]
    hooks: list[str]
    schema_version: int
    created_with: dict[str, str]
    saes: dict[str, SaeRecord]
    clts: dict[str, dict[str, Any]]
