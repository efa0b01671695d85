"""Checksums verified on read: a process-wide sha256 cache and the SAE weights check.

`cached_sha256` hashes a file once per process for each version of it (its inode, size
and modification time), so hot paths can verify a checksum on every load without
re-reading the file. `verify_sae_weights` checks an atlas SAE's `sae_weights.safetensors`
against the sha256 recorded in its `cfg.json` (section `sae_atlas.sha256`, written by
`saes.formats.saelens.save_saelens`); every path that loads or indexes weights calls it
first, so corrupt weights are named as such instead of surfacing as a stale index.

Every file derived from an SAE's weights (summary tables, map, record tables, indexes,
eval.json) records their sha256 under `WEIGHTS_SHA256` (`weights_record`), and its reader
checks it (`check_weights_record`), so files that are each intact but derived from other
weights (copied from another SAE, or left from before a re-train) are refused by name.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sae_atlas.errors import IntegrityError
from sae_atlas.store.atomic import read_json, sha256_file
from sae_atlas.store.layout import AtlasLayout

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
CHECKSUM_SECTION = "sae_atlas"  # our section of cfg.json, holding the sha256 of every file we wrote
WEIGHTS_SHA256 = "weights_sha256"  # the key under which a derived file records the weights it came from
DERIVED_FROM_OTHER_WEIGHTS = (f"stale: derived from other weights than the SAE's current {WEIGHTS_FILE} (copied "
                              "from another SAE, or left from before the SAE was re-trained or re-imported)")

_hashes: dict[tuple[str, int, int, int], str] = {}
_lock = threading.Lock()


def cached_sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file, computed once per (path, inode, size, mtime) in this process."""
    resolved = os.path.abspath(path)
    stat = os.stat(resolved)
    key = (resolved, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _lock:
        known = _hashes.get(key)
    if known is None:
        known = sha256_file(resolved)
        with _lock:
            _hashes[key] = known
    return known


def weights_repair(sae_id: str) -> str:
    """What to run when an SAE's files are damaged."""
    return f"re-train (`sae-atlas train --overwrite`) or re-import SAE {sae_id!r}, then `sae-atlas index --rebuild`"


def sae_cfg(root: str | Path, sae_id: str) -> dict[str, Any]:
    """The SAE's cfg.json (NotFoundError for an unknown id, IntegrityError if unreadable)."""
    folder = AtlasLayout(root).require_sae(sae_id)
    cfg = read_json(folder / CFG_FILE, weights_repair(sae_id))
    if not isinstance(cfg, dict):
        raise IntegrityError(folder / CFG_FILE, "not a JSON object", weights_repair(sae_id))
    return cfg


def recorded_sha256(cfg: dict[str, Any], name: str) -> str | None:
    """The sha256 cfg.json records for file `name` of the folder, or None (a foreign
    SAELens folder records none)."""
    section = cfg.get(CHECKSUM_SECTION)
    if not isinstance(section, dict):
        return None
    value = (section.get("sha256") or {}).get(name) if isinstance(section.get("sha256"), dict) else None
    return str(value) if value is not None else None


def verify_file(path: Path, expected: str | None, recorded_in: str, repair: str) -> str:
    """The sha256 of `path` after checking it against `expected` (skipped when None);
    IntegrityError naming the file when it is missing or differs."""
    if not path.is_file():
        raise IntegrityError(path, "file is missing", repair)
    actual = cached_sha256(path)
    if expected is not None and actual != expected:
        raise IntegrityError(path, f"sha256 does not match the one recorded in {recorded_in} "
                             "(the file is corrupt or was changed)", repair)
    return actual


def verify_sae_weights(root: str | Path, sae_id: str) -> str:
    """The sha256 of the SAE's weights file, verified against cfg.json (IntegrityError
    naming the file and the repair on a mismatch or a missing file)."""
    cfg = sae_cfg(root, sae_id)
    folder = AtlasLayout(root).sae_dir(sae_id)
    return verify_file(folder / WEIGHTS_FILE, recorded_sha256(cfg, WEIGHTS_FILE), f"{folder / CFG_FILE}",
                       weights_repair(sae_id))


def weights_record(root: str | Path, sae_id: str) -> dict[str, str]:
    """What a file derived from an SAE records of its weights: `{WEIGHTS_SHA256: sha256}`
    of the current, verified weights file (writers merge it into their sidecar)."""
    return {WEIGHTS_SHA256: verify_sae_weights(root, sae_id)}


def check_weights_record(root: str | Path, sae_id: str, record: Mapping[str, Any], path: Path, repair: str) -> None:
    """IntegrityError naming the derived file `path` (with `repair`, the command that
    rebuilds it) when `record`, its sidecar, records other weights than the SAE's current,
    verified ones. A sidecar written before derived files recorded their weights has no
    `WEIGHTS_SHA256` and is accepted as before (nothing to compare it with)."""
    recorded = record.get(WEIGHTS_SHA256)
    if recorded is not None and recorded != verify_sae_weights(root, sae_id):
        raise IntegrityError(path, DERIVED_FROM_OTHER_WEIGHTS, repair)
