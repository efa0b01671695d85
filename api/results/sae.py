"""`SaeInfo`: facts about one SAE (`Atlas.sae_info`), and `SaeStatus`, the same with its
health (`Atlas.sae_status`, one row of `Atlas.saes()`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from typing_extensions import TypedDict

from api.results.wire import Number


class SaeInfo(TypedDict):
    """One SAE: its hook, architecture, widths and the held-out metrics recorded at training."""

    sae_id: str
    hook: str | None
    architecture: str | None
    d_in: int | None
    d_sae: int | None
    k: int | None
    fvu: Number
    l0: Number
    dead_fraction: Number
    source: Annotated[str, Field(description="'trained', or the SOURCE it was imported from")]
    suspect: Annotated[bool, Field(description="imported with --force despite the misload guard")]


class SaeStatus(SaeInfo):
    """One SAE and whether it can be served."""

    status: Annotated[Literal["ok", "damaged"], Field(
        description="'damaged': a file of the SAE is missing, truncated or corrupt; its pages answer 500 naming it")]
    problem: Annotated[str | None, Field(description="for a damaged SAE: the file, what is wrong, the repair")]
