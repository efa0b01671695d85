"""Where everything lives inside an atlas directory, and `atlas.json`.

```
atlas.json                 schema version, model spec, hooks, SAEs, created-with versions
activations/<hook>/        manifest.json + shard-00000.safetensors ...
saes/<sae_id>/             cfg.json, sae_weights.safetensors, training.json (trained) or
                           source.json (imported: provenance), eval.json, checkpoints/,
                           features.parquet, examples.parquet, index.faiss, map.parquet
analyses/<kind>/<run>.*    geometry results with their parameters
```

`atlas.json["saes"][sae_id]` records each SAE's hook, architecture, widths and held-out
metrics; an imported one also has `source` (kind, SOURCE, format) and `suspect` (kept with
`--force` despite the misload guard).
"""

from __future__ import annotations

import platform
import re
from pathlib import Path
from typing import Any

from store.atomic import atomic_write_json, read_json
from store.errors import IntegrityError, InvalidInputError, NotFoundError

SCHEMA_VERSION = 1
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_id(value: str, what: str = "id") -> str:
    """Return `value` if it is a safe path component (no '/', no '..'); else raise."""
    if not isinstance(value, str) or not _SAFE_ID.match(value) or ".." in value:
        raise InvalidInputError(
            f"invalid {what} {value!r}: use letters, digits, '.', '_' or '-' (no '/' or '..')"
        )
    return value


def created_with() -> dict[str, str]:
    """Versions of the libraries that produce atlas files (recorded in every result)."""
    import importlib.metadata as md

    versions = {"python": platform.python_version()}
    for dist in ("sae-atlas", "torch", "transformer-lens", "transformers", "faiss-cpu", "polars"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return versions


class AtlasLayout:
    """Paths of one atlas directory. Creates nothing until asked."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def atlas_json(self) -> Path:
        return self.root / "atlas.json"

    def activation_dir(self, hook: str) -> Path:
        return self.root / "activations" / check_id(hook, "hook name")

    def sae_dir(self, sae_id: str) -> Path:
        return self.root / "saes" / check_id(sae_id, "SAE id")

    def analysis_dir(self, kind: str) -> Path:
        return self.root / "analyses" / check_id(kind, "analysis kind")

    def registered_sae_ids(self) -> list[str]:
        """SAE ids recorded in atlas.json (none when the atlas has no atlas.json yet)."""
        if not self.atlas_json.exists():
            return []
        saes = self.read_meta().get("saes") or {}
        return sorted(saes) if isinstance(saes, dict) else []

    def sae_ids(self) -> list[str]:
        """SAE ids that have saved weights or are registered in atlas.json, sorted. A
        registered SAE whose files are missing stays listed: reading it raises
        IntegrityError (`require_sae`) instead of it silently dropping out of searches."""
        base = self.root / "saes"
        saved = {p.name for p in base.iterdir() if (p / "cfg.json").exists()} if base.is_dir() else set()
        return sorted(saved | set(self.registered_sae_ids()))

    def require_sae(self, sae_id: str) -> Path:
        """The SAE's directory: NotFoundError listing the valid ids for an unknown one,
        IntegrityError for one registered in atlas.json whose cfg.json is missing."""
        path = self.sae_dir(sae_id)
        if not (path / "cfg.json").exists():
            if sae_id in self.registered_sae_ids():
                raise IntegrityError(
                    path / "cfg.json", f"SAE {sae_id!r} is registered in atlas.json but its cfg.json is missing",
                    f"re-train (`sae-atlas train --atlas {self.root} --overwrite`) or re-import SAE {sae_id!r}",
                )
            valid = ", ".join(self.sae_ids()) or "(none trained yet)"
            raise NotFoundError(f"unknown SAE id {sae_id!r}; valid: {valid}")
        return path

    def recorded_hooks(self) -> list[str]:
        """Hooks atlas.json records as cached (none when there is no atlas.json yet)."""
        hooks = self.read_meta().get("hooks") if self.atlas_json.exists() else None
        return [str(h) for h in hooks] if isinstance(hooks, list) else []

    def cached_hooks(self) -> list[str]:
        """Hooks that have an activation manifest, sorted."""
        base = self.root / "activations"
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "manifest.json").exists())

    # atlas.json -------------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any]:
        """Read atlas.json (IntegrityError if missing or corrupt)."""
        return read_json(
            self.atlas_json, f"re-create the atlas with `sae-atlas cache --atlas {self.root}`"
        )

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write atlas.json atomically, stamping schema version and versions."""
        meta = dict(meta)
        meta["schema_version"] = SCHEMA_VERSION
        meta["created_with"] = created_with()
        atomic_write_json(self.atlas_json, meta)

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into atlas.json (creating it if absent) and return the result."""
        meta = self.read_meta() if self.atlas_json.exists() else {}
        meta.update(fields)
        self.write_meta(meta)
        return meta
