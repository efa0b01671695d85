"""A cross-layer transcoder on disk: `clts/<clt_id>/` of an atlas (`store.layout`).

`clt_weights.safetensors` holds `W_enc [L, d, F]`, `b_enc [L, F]`, `b_dec [L, d]`,
`threshold [L, F]` (JumpReLU) and `W_dec_<l> [F, L - l, d]` per layer (circuit-tracer's
decoder layout); `cfg.json` holds the `CLTConfig` and the weights' sha256, written last,
so a folder with a cfg.json is complete. Every read verifies the checksum and the shapes.
atlas.json lists each CLT under `clts` (`clt_record`), like the SAEs under `saes`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.devices import resolve_device
from sae_atlas.saes.formats.assembly import read_safetensors
from sae_atlas.saes.transcoders.clt import CLTConfig, CrossLayerTranscoder, build_clt
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.integrity import cached_sha256
from sae_atlas.store.layout import AtlasLayout, created_with
from sae_atlas.store.safetensors_io import save_deterministic

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "clt_weights.safetensors"
FORMAT_VERSION = 1


def clt_tensors(clt: CrossLayerTranscoder) -> dict[str, torch.Tensor]:
    """The tensors written to `clt_weights.safetensors` (see the module doc)."""
    out = {"W_enc": clt.W_enc, "b_enc": clt.b_enc, "b_dec": clt.b_dec}
    out.update({f"W_dec_{layer}": w for layer, w in enumerate(clt.W_dec)})
    if clt.cfg.architecture == "jumprelu":
        out["threshold"] = clt.threshold
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def save_clt(clt: CrossLayerTranscoder, folder: str | Path) -> None:
    """Write `clt` to `folder` (weights, then cfg.json with their sha256; both atomic)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / WEIGHTS_FILE) as tmp:
        save_deterministic(clt_tensors(clt), tmp, {"format": "pt"})
    dtype = str(clt.W_enc.dtype).removeprefix("torch.")
    atomic_write_json(folder / CFG_FILE, {
        "format_version": FORMAT_VERSION, "clt_config": {**clt.cfg.to_dict(), "dtype": dtype},
        "sha256": {WEIGHTS_FILE: sha256_file(folder / WEIGHTS_FILE)}, "created_with": created_with()})


def _repair(folder: Path) -> str:
    return f"re-train or re-import the CLT (delete {folder} first)"


def saved_clt_config(folder: str | Path) -> CLTConfig:
    """The config a CLT folder was saved with, read without its weights (IntegrityError if damaged)."""
    folder = Path(folder)
    raw = read_json(folder / CFG_FILE, _repair(folder))
    try:
        return CLTConfig.from_dict(raw["clt_config"])
    except (KeyError, TypeError, InvalidInputError) as exc:
        raise IntegrityError(folder / CFG_FILE, f"no valid clt_config section ({exc})", _repair(folder)) from exc


def load_clt_folder(folder: str | Path, *, device: str | torch.device | None = None) -> CrossLayerTranscoder:
    """The CLT saved in `folder`, in eval mode, after checking the weights' sha256 and
    every tensor's shape (IntegrityError naming the file)."""
    folder = Path(folder)
    cfg = saved_clt_config(folder)
    raw = read_json(folder / CFG_FILE, _repair(folder))
    expected = (raw.get("sha256") or {}).get(WEIGHTS_FILE)
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise IntegrityError(path, "file is missing", _repair(folder))
    if expected is None or cached_sha256(path) != expected:
        raise IntegrityError(path, f"sha256 does not match the one recorded in {CFG_FILE}", _repair(folder))
    tensors = read_safetensors(path, _repair(folder))
    clt = build_clt(cfg)
    state = {k: v for k, v in tensors.items() if k != "threshold"}
    state = {("W_dec." + k.removeprefix("W_dec_") if k.startswith("W_dec_") else k): v for k, v in state.items()}
    if cfg.architecture == "jumprelu":
        if "threshold" not in tensors:
            raise IntegrityError(path, "a jumprelu CLT needs its threshold tensor", _repair(folder))
        state["log_threshold"] = tensors["threshold"].float().log()
    wanted = {k: tuple(v.shape) for k, v in clt.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if wanted != got:
        raise IntegrityError(path, f"tensors {got} do not match the config's shapes {wanted}", _repair(folder))
    clt.load_state_dict(state)
    return clt.to(device=resolve_device(device), dtype=getattr(torch, cfg.dtype)).eval()


def clt_dir(root: str | Path, clt_id: str) -> Path:
    """The folder of CLT `clt_id` of an atlas: NotFoundError naming the valid ids if it has none."""
    layout = AtlasLayout(root)
    folder = layout.clt_dir(clt_id)
    if not (folder / CFG_FILE).is_file():
        if clt_id in (layout.read_meta().get("clts") or {} if layout.atlas_json.exists() else {}):
            raise IntegrityError(folder / CFG_FILE, f"CLT {clt_id!r} is registered in atlas.json but its "
                                 "cfg.json is missing", _repair(folder))
        raise NotFoundError(f"unknown CLT id {clt_id!r}; valid: {', '.join(layout.clt_ids()) or '(none)'}")
    return folder


def load_atlas_clt(root: str | Path, clt_id: str, *, device: str | torch.device | None = None) -> CrossLayerTranscoder:
    """CLT `clt_id` of the atlas at `root`, verified (`load_clt_folder`)."""
    return load_clt_folder(clt_dir(root, clt_id), device=device)


def clt_record(clt_id: str, cfg: CLTConfig, metrics: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """What atlas.json records of a CLT: its identity, hooks and measured metrics."""
    return {"clt_id": clt_id, "architecture": cfg.architecture, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
            "d_sae": cfg.d_sae, "k": cfg.k, "hooks_in": cfg.hooks_in, "hooks_out": cfg.hooks_out,
            "fvu": metrics.get("fvu"), "l0": metrics.get("l0"), **extra}


def register_clt(root: str | Path, record: dict[str, Any]) -> None:
    """Record a CLT in atlas.json under `clts`."""
    layout = AtlasLayout(root)
    clts = dict(layout.read_meta().get("clts") or {})
    clts[record["clt_id"]] = record
    layout.update_meta(clts=clts)
