"""sae-atlas: sparse autoencoders, transcoders and feature geometry over transformer
activations, with FAISS feature search, an HTTP service and an explorer.

The installed namespace maps the repository's top-level folders: `sae_atlas.saes`
(models, dictionaries, training, evals, interventions), `sae_atlas.store` (the on-disk
atlas), `sae_atlas.geometry` (structure among features and across depth) and
`sae_atlas.api` (the `Atlas` facade, the HTTP service, the CLI). `from sae_atlas import
Atlas` is the entry point; it is imported on first use, so the CLI starts without torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "setup.py").is_file() and (_CHECKOUT / "saes").is_dir():
    # A source checkout: its folders are the subpackages, so `PYTHONPATH=<checkout>` runs
    # that checkout's code with or without an (editable) install.
    __path__.append(str(_CHECKOUT))

if TYPE_CHECKING:
    from sae_atlas.api.atlas import Atlas

__all__ = ["Atlas"]


def __getattr__(name: str) -> Any:
    if name == "Atlas":
        from sae_atlas.api.atlas import Atlas

        return Atlas
    raise AttributeError(f"module 'sae_atlas' has no attribute {name!r}")
