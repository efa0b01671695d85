"""The HTTP service over an atlas (FastAPI + uvicorn).

`create_app` and `serve` are imported on first use, so that reading `api.http.settings`
(as the CLI's `serve` options do) loads neither FastAPI nor torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sae_atlas.api.http.settings import ServerSettings

if TYPE_CHECKING:
    from sae_atlas.api.http.app import create_app, serve

__all__ = ["ServerSettings", "create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "serve"):
        from sae_atlas.api.http import app

        return getattr(app, name)
    raise AttributeError(f"module 'sae_atlas.api.http' has no attribute {name!r}")
