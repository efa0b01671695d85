"""The query API of sae-atlas: the `Atlas` facade, the HTTP service, its client and the CLI.

`Atlas` is imported on first use (`from api import Atlas`), so that `api.cli` can start
without loading torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.atlas import Atlas

__all__ = ["Atlas"]


def __getattr__(name: str) -> Any:
    if name == "Atlas":
        from api.atlas import Atlas

        return Atlas
    raise AttributeError(f"module 'api' has no attribute {name!r}")
