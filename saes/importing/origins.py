"""Where an imported SAE comes from: a local folder, a registry entry or a Hugging Face path.

- a local folder in any layout `saes.formats.detect_layout` knows (or a circuit-tracer
  layer file, `layer_<i>.safetensors` beside its set's `config.yaml`);
- `RELEASE/SAE_ID`, looked up in a YAML registry in SAELens' `pretrained_saes.yaml`
  schema (`<release>: {repo_id, model, saes: [{id, path, l0, norm_scaling_factor}]}`); the
  default is the small registry shipped in `saes/data/`, and SAELens' own file works too;
- `hf://org/repo/path[@revision]`, fetched with `huggingface_hub` (which honours
  `HF_HUB_OFFLINE` and its local cache).

Registry entries are fetched from their `repo_id` the same way. The resolved folder comes
with the provenance recorded in `source.json`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.formats.circuit_tracer import is_circuit_tracer_file

DEFAULT_REGISTRY = Path(__file__).resolve().parents[1] / "data" / "pretrained_saes.yaml"
HF_PREFIX = "hf://"
SourceKind = Literal["local", "registry", "hf"]


@dataclass
class ResolvedSource:
    """A local folder holding the SAE, and what is known about where it came from."""

    folder: Path
    kind: SourceKind
    source: str
    provenance: dict[str, Any] = field(default_factory=dict)
    norm_scaling_factor: float | None = None  # from the registry entry, if it gives one
    expected_l0: float | None = None  # the registry's recorded L0, if any


@dataclass(frozen=True)
class HFPath:
    """`hf://org/repo/path[@revision]` split into its parts."""

    repo_id: str
    path: str
    revision: str | None

    @classmethod
    def parse(cls, source: str) -> HFPath:
        body = source.removeprefix(HF_PREFIX)
        revision = None
        if "@" in body:
            body, revision = body.rsplit("@", 1)
        parts = [p for p in body.split("/") if p]
        if len(parts) < 2 or not revision and source.endswith("@") or any(p == ".." for p in parts):
            raise InvalidInputError(f"{source!r} is not hf://org/repo/path[@revision]")
        return cls("/".join(parts[:2]), "/".join(parts[2:]), revision or None)


def fetch_hf_folder(repo_id: str, path: str, revision: str | None) -> tuple[Path, str]:
    """The local folder `path` of a Hugging Face repo (downloaded, or from the cache when
    `HF_HUB_OFFLINE=1`) and the commit it was resolved to."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    patterns = [f"{path}/*", f"{path}/**"] if path else None
    try:
        snapshot = Path(snapshot_download(repo_id=repo_id, revision=revision, allow_patterns=patterns))
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HFValidationError, OSError) as exc:
        offline = " (HF_HUB_OFFLINE is set: only the local cache is used)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise NotFoundError(f"cannot fetch hf://{repo_id}/{path}@{revision or 'main'}{offline}: {exc}") from exc
    folder = snapshot / path if path else snapshot
    if not folder.is_dir():
        raise NotFoundError(f"hf://{repo_id}/{path}: no such folder in revision {snapshot.name}")
    return folder, snapshot.name


def read_registry(path: str | Path | None = None) -> dict[str, Any]:
    """A registry YAML (`pretrained_saes.yaml` schema) as a dict of releases."""
    import yaml

    registry = Path(path) if path else DEFAULT_REGISTRY
    if not registry.is_file():
        raise NotFoundError(f"registry file {registry} does not exist")
    try:
        data = yaml.load(registry.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"{registry}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InvalidInputError(f"{registry}: expected a mapping of releases (SAELens pretrained_saes.yaml schema)")
    return data


def _number(entry: dict[str, Any], key: str) -> float | None:
    value = entry.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def registry_entry(source: str, registry: str | Path | None = None) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """(release, sae id, release record, SAE record) for `RELEASE/SAE_ID`; NotFoundError
    listing the valid releases or ids when either is unknown."""
    data = read_registry(registry)
    release, _, sae_id = source.partition("/")
    if release not in data:
        raise NotFoundError(
            f"{source!r} is neither a folder nor a registry entry: unknown release {release!r}; "
            f"releases in {registry or DEFAULT_REGISTRY}: {', '.join(sorted(data)[:30])}"
        )
    record = data[release]
    saes = {str(s.get("id")): s for s in record.get("saes") or [] if isinstance(s, dict)}
    if sae_id not in saes:
        raise NotFoundError(f"release {release!r} has no SAE {sae_id!r}; valid: {', '.join(list(saes)[:30])}")
    if not record.get("repo_id"):
        raise InvalidInputError(f"release {release!r} has no repo_id")
    return release, sae_id, record, saes[sae_id]


def resolve_source(source: str | Path, *, registry: str | Path | None = None) -> ResolvedSource:
    """Turn SOURCE (a folder, `RELEASE/SAE_ID` or `hf://org/repo/path[@revision]`) into a
    local folder plus its provenance."""
    text = str(source)
    if text.startswith(HF_PREFIX):
        where = HFPath.parse(text)
        folder, commit = fetch_hf_folder(where.repo_id, where.path, where.revision)
        return ResolvedSource(folder, "hf", text, {"repo_id": where.repo_id, "path": where.path,
                                                  "revision": commit, "requested_revision": where.revision})
    local = Path(text).expanduser()
    if local.exists():
        if not local.is_dir() and not is_circuit_tracer_file(local):
            raise InvalidInputError(f"{local} is a file; pass the folder that holds the SAE (a file only for a "
                                    "circuit-tracer layer, beside its config.yaml)")
        return ResolvedSource(local.resolve(), "local", text, {"path": str(local.resolve())})
    release, sae_id, record, entry = registry_entry(text, registry)
    path = str(entry.get("path") or "")
    folder, commit = fetch_hf_folder(str(record["repo_id"]), path, None)
    provenance = {
        "release": release, "registry_sae_id": sae_id, "repo_id": record["repo_id"], "path": path,
        "revision": commit, "model": record.get("model"), "registry": str(Path(registry or DEFAULT_REGISTRY)),
        "conversion_func": record.get("conversion_func"), "neuronpedia": entry.get("neuronpedia"),
    }
    return ResolvedSource(folder, "registry", text, provenance,
                          _number(entry, "norm_scaling_factor"), _number(entry, "l0"))
