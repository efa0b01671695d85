"""The typed-result layer of `registration`; its other layers:
`sae_atlas.api.services.registration` (service).

`Registration`: one row of `Atlas.register`'s report (`sae-atlas register`)."""

from __future__ import annotations

from typing import Literal

from typing_extensions import TypedDict


class Registration(TypedDict):
    """One SAE folder or analysis run registered again, or why it was refused."""

    what: Literal["sae", "analysis"]
    name: str
    """The SAE id, or the run as KIND/RUN."""
    result: str
    """"registered", or "refused: <the error>"."""
