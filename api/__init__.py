"""The query API of sae-atlas: the `Atlas` facade, the HTTP service, its client and the CLI.

`Atlas` is imported on first use (`from sae_atlas import Atlas`), so that the CLI can start
without loading torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sae_atlas.api.atlas import Atlas

__all__ = ["Atlas"]


def __getattr__(name: str) -> Any:
    if name == "Atlas":
        from sae_atlas.api.atlas import Atlas

        return Atlas
    raise AttributeError(f"module 'sae_atlas.api' has no attribute {name!r}")
