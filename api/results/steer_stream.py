"""The typed-result layer of `steer_stream`; its other layers:
`sae_atlas.api.services.steer_stream` (service).

The events of a streamed steered generation (`Atlas.steer_stream`, `POST /steer/stream`):
one `SteerTokens` per decoding step, the baseline and edited continuations side by side."""

from __future__ import annotations

from typing_extensions import TypedDict


class TokenPiece(TypedDict):
    """A new token and the text it adds to its continuation (empty while it only starts a
    character that the next tokens complete)."""

    token_id: int
    text: str


class SteerTokens(TypedDict):
    """One decoding step: each continuation's new token (null once it has ended with EOS)."""

    step: int
    baseline: TokenPiece | None
    edited: TokenPiece | None
