"""The query API of sae-atlas: the `Atlas` facade, the HTTP service, its client and the CLI."""

from api.atlas import Atlas

__all__ = ["Atlas"]
