"""Settings of the HTTP service, passed to worker processes through environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sae_atlas.errors import InvalidInputError

ENV_ROOT = "SAE_ATLAS_ROOT"
ENV_TOKEN = "SAE_ATLAS_TOKEN"
ENV_ALLOW_ANALYSES = "SAE_ATLAS_ALLOW_ANALYSES"
ENV_ALLOW_INTERVENTIONS = "SAE_ATLAS_ALLOW_INTERVENTIONS"
ENV_MAX_BODY = "SAE_ATLAS_MAX_BODY_BYTES"
ENV_THREADS = "SAE_ATLAS_THREADS"
DEFAULT_MAX_BODY = 256 * 1024


@dataclass(frozen=True)
class ServerSettings:
    """What one server process needs: the atlas, the optional bearer token, whether
    analyses may be started, the largest request body accepted (bytes) and the compute
    threads (torch, FAISS) of each worker (None: leave the libraries' defaults)."""

    root: Path
    token: str | None = None
    allow_analyses: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY
    threads: int | None = None
    allow_interventions: bool = False  # POST /run, /steer, /attribute (they run the model)

    def to_env(self) -> dict[str, str]:
        """The settings as environment variables (for `uvicorn --workers` processes)."""
        env = {ENV_ROOT: str(self.root), ENV_ALLOW_ANALYSES: "1" if self.allow_analyses else "0",
               ENV_ALLOW_INTERVENTIONS: "1" if self.allow_interventions else "0",
               ENV_MAX_BODY: str(self.max_body_bytes)}
        if self.token:
            env[ENV_TOKEN] = self.token
        if self.threads:
            env[ENV_THREADS] = str(self.threads)
        return env

    @classmethod
    def from_env(cls) -> ServerSettings:
        """Settings from the environment (`SAE_ATLAS_ROOT` is required); InvalidInputError
        names a variable that is missing or not a positive integer."""
        root = os.environ.get(ENV_ROOT)
        if not root:
            raise InvalidInputError(f"{ENV_ROOT} is not set; start the server with `sae-atlas serve ATLAS`")
        return cls(
            root=Path(root),
            token=os.environ.get(ENV_TOKEN) or None,
            allow_analyses=os.environ.get(ENV_ALLOW_ANALYSES) == "1",
            allow_interventions=os.environ.get(ENV_ALLOW_INTERVENTIONS) == "1",
            max_body_bytes=_env_int(ENV_MAX_BODY) or DEFAULT_MAX_BODY,
            threads=_env_int(ENV_THREADS),
        )


def _env_int(name: str) -> int | None:
    """A positive integer environment variable, or None when unset."""
    text = os.environ.get(name)
    if not text:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise InvalidInputError(f"{name}={text!r} is not a positive integer")
    return int(text)
