"""`SaeInfo`: facts about one SAE (`Atlas.sae_info`), `SaeStatus`, the same with its
health (`Atlas.sae_status`, one row of `Atlas.saes()`), and `Status`, the health of a
stored SAE or analysis run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from typing_extensions import TypedDict

from sae_atlas.api.results.wire import Number

Status = Literal["ok", "damaged", "unregistered"]
"""Whether a stored SAE or analysis run is served: "ok"; "damaged" (a file of it is missing,
truncated or corrupt); "unregistered" (on disk, but atlas.json or its kind's runs.json does
not list it; `sae-atlas register` records it again)."""


class SaeInfo(TypedDict):
    """One SAE: its hook, architecture, widths and the held-out metrics recorded at training."""

    sae_id: str
    hook: Annotated[str | None, Field(description="the hook the SAE reads (its features' activations)")]
    hook_out: Annotated[str | None, Field(
        description="the hook a transcoder writes (its decoder directions live there); null for an SAE, "
                    "which writes the hook it reads")]
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

    steering_table: Annotated[bool, Field(
        description="whether `sae-atlas steering-scores` stored its steering table (the Steer page ranks from it)")]
    status: Annotated[Status, Field(
        description="'damaged': a file of the SAE is missing, truncated or corrupt; its pages answer 500 naming it. "
                    "'unregistered': its folder is on disk but atlas.json does not list it; its pages are served "
                    "from the folder and the facts shown are the record `sae-atlas register` would write")]
    problem: Annotated[str | None, Field(
        description="for a damaged SAE: the file, what is wrong, the repair; for an unregistered one: the command "
                    "that registers it again (or why it cannot be)")]
