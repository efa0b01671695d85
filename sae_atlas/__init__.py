"""sae-atlas: sparse autoencoders, transcoders and feature geometry over transformer
activations, with FAISS feature search, an HTTP service and an explorer.

The installed namespace maps the repository's top-level folders: `sae_atlas.saes`
(models, dictionaries, training, evals, interventions), `sae_atlas.store` (the on-disk
atlas), `sae_atlas.geometry` (structure among features and across depth) and
`sae_atlas.api` (the `Atlas` facade, the HTTP service, the CLI). `from sae_atlas import
Atlas` is the entry point; it is imported on first use, so the CLI starts without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sae_atlas.api.atlas import Atlas

__all__ = ["Atlas"]


def __getattr__(name: str) -> Any:
    if name == "Atlas":
        from sae_atlas.api.atlas import Atlas

        return Atlas
    raise AttributeError(f"module 'sae_atlas' has no attribute {name!r}")
