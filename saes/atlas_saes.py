"""The one way to read an SAE of an atlas by its id.

Every SAE stored in an atlas (trained or imported) is a SAELens-layout folder under
`saes/<sae_id>/`; loading goes through `load_atlas_sae` only, so the checks on that path
(the folder exists, the recorded sha256s match, the config is valid) apply to every caller.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.devices import resolve_device
from sae_atlas.saes.formats.saelens import CFG_FILE, load_saelens
from sae_atlas.saes.sae.base import SAE
from sae_atlas.store.hooks import cfg_hook_name
from sae_atlas.store.integrity import sae_cfg, verify_sae_weights
from sae_atlas.store.layout import AtlasLayout


def _repair(sae_id: str) -> str:
    return f"re-train or re-import SAE {sae_id!r}"


def load_atlas_sae(root: str | Path, sae_id: str, *, device: str | torch.device | None = None) -> SAE:
    """SAE `sae_id` of the atlas at `root`, in eval mode on `device` (`saes.devices.resolve_device`:
    None is `$SAE_ATLAS_DEVICE`, else cpu) (NotFoundError for an
    unknown id, IntegrityError for a missing, truncated or mismatched file). The weights'
    sha256 is checked first (`store.integrity.verify_sae_weights`, hashed once per process
    per file version)."""
    folder = AtlasLayout(root).require_sae(sae_id)
    verify_sae_weights(root, sae_id)
    return load_saelens(folder, device=resolve_device(device)).eval()


def atlas_sae_hook(root: str | Path, sae_id: str) -> str:
    """The hook SAE `sae_id` reads, from its cfg.json (`metadata.hook_name`), without
    loading the weights; InvalidInputError if none is recorded."""
    hook = cfg_hook_name(sae_cfg(root, sae_id))
    if not hook:
        folder = AtlasLayout(root).sae_dir(sae_id)
        raise InvalidInputError(f"{folder / CFG_FILE} names no hook (metadata.hook_name); {_repair(sae_id)}")
    return hook


def atlas_sae_output_width(root: str | Path, sae_id: str) -> int | None:
    """The width of what SAE `sae_id` writes (its decoder rows: `d_out` for a transcoder,
    else `d_in`) from its cfg.json, without loading the weights; None when cfg.json records
    neither as an integer (loading then tells what is wrong)."""
    cfg = sae_cfg(root, sae_id)
    width = cfg.get("d_out") if cfg.get("d_out") is not None else cfg.get("d_in")
    return width if isinstance(width, int) and not isinstance(width, bool) else None


def hook_of(sae: SAE, sae_id: str) -> str:
    """The hook a loaded atlas SAE reads (`cfg.hook_name`); InvalidInputError if empty."""
    if not sae.cfg.hook_name:
        raise InvalidInputError(f"SAE {sae_id!r} records no hook name (cfg.hook_name); {_repair(sae_id)}")
    return sae.cfg.hook_name
