"""Where everything lives inside an atlas directory, and `atlas.json`.

```
atlas.json                 schema version, model spec, hooks, SAEs, created-with versions
activations/<hook>/        manifest.json + shard-00000.safetensors ...
saes/<sae_id>/             cfg.json, sae_weights.safetensors, training.json (trained) or
                           source.json (imported: provenance), eval.json, checkpoints/,
                           features.parquet, examples.parquet, index.faiss, map.parquet
clts/<clt_id>/             a cross-layer transcoder: cfg.json, clt_weights.safetensors,
                           training.json (trained) or source.json + eval.json (imported)
analyses/<kind>/<run>.*    geometry results with their parameters
```

`atlas.json["clts"][clt_id]` records each cross-layer transcoder the same way.
`atlas.json["saes"][sae_id]` records each SAE's hook, architecture, widths and held-out
metrics; an imported one also has `source` (kind, SOURCE, format) and `suspect` (kept with
`--force` despite the misload guard). An SAE folder that atlas.json does not list (a train
or import killed before it registered the SAE, or an atlas.json restored from elsewhere) is
*unregistered*: readers still find its files, listings report it, and `sae-atlas register`
records it again (`saes.atlas_records`).
"""

from __future__ import annotations

import platform
import re
from pathlib import Path
from typing import Any

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.store.atomic import atomic_write_json, read_json

SCHEMA_VERSION = 1
MAX_ID_LENGTH = 128
ID_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
"""A safe id (SAE id, hook name, analysis kind or run) as a JSON-schema pattern, with
`MAX_ID_LENGTH`: a letter or digit, then letters, digits, '.', '_' or '-', never '..'.
Request schemas state it wherever an id appears, so the server refuses no id they allow."""
_SAFE_ID = re.compile(ID_PATTERN)


def is_id(value: object) -> bool:
    """Whether `value` is a safe path component (`ID_PATTERN`: no '/', no '..')."""
    return isinstance(value, str) and len(value) <= MAX_ID_LENGTH and _SAFE_ID.fullmatch(value) is not None


def check_id(value: str, what: str = "id") -> str:
    """Return `value` if it is a safe path component (`is_id`); else raise."""
    if not is_id(value):
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

    def clt_dir(self, clt_id: str) -> Path:
        return self.root / "clts" / check_id(clt_id, "CLT id")

    def clt_ids(self) -> list[str]:
        """Ids of the cross-layer transcoders saved (a folder with a cfg.json) or registered, sorted."""
        base = self.root / "clts"
        saved = {p.name for p in base.iterdir() if (p / "cfg.json").exists()} if base.is_dir() else set()
        registered = self.read_meta().get("clts") or {} if self.atlas_json.exists() else {}
        return sorted(saved | set(registered if isinstance(registered, dict) else {}))

    def analysis_dir(self, kind: str) -> Path:
        return self.root / "analyses" / check_id(kind, "analysis kind")

    def registered_sae_ids(self) -> list[str]:
        """SAE ids recorded in atlas.json (none when the atlas has no atlas.json yet)."""
        if not self.atlas_json.exists():
            return []
        saes = self.read_meta().get("saes") or {}
        return sorted(saes) if isinstance(saes, dict) else []

    def saved_sae_ids(self) -> list[str]:
        """SAE ids with a folder holding a cfg.json, sorted."""
        base = self.root / "saes"
        return sorted(p.name for p in base.iterdir() if (p / "cfg.json").exists()) if base.is_dir() else []

    def sae_ids(self) -> list[str]:
        """SAE ids that have saved weights or are registered in atlas.json, sorted. A
        registered SAE whose files are missing stays listed: reading it raises
        IntegrityError (`require_sae`) instead of it silently dropping out of searches."""
        return sorted(set(self.saved_sae_ids()) | set(self.registered_sae_ids()))

    def unregistered_sae_ids(self) -> list[str]:
        """Ids of the saved SAEs that atlas.json does not list (none without an atlas.json)."""
        if not self.atlas_json.exists():
            return []
        registered = set(self.registered_sae_ids())
        return [sae_id for sae_id in self.saved_sae_ids() if sae_id not in registered]

    def unregistered_sae(self, sae_id: str) -> IntegrityError:
        """What is wrong with an unregistered SAE (`unregistered_sae_ids`) and the command
        that registers it again."""
        return IntegrityError(
            self.atlas_json, f"SAE {sae_id!r} is on disk (saes/{sae_id}/) but atlas.json does not list it",
            f"register it again with `sae-atlas register <atlas> --sae {sae_id}` (its record is rebuilt "
            "from the folder's cfg.json, training.json or source.json and eval.json)",
        )

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
            self.atlas_json, f"re-create the atlas with `sae-atlas cache {self.root}`"
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
