"""Import EleutherAI sparsify sparse coders (one folder per hookpoint) as TopK SAEs.

A folder holds `cfg.json` (`d_in`, `num_latents` or `expansion_factor`, `k`,
`activation`, `transcode`, `skip_connection`, ...) and `sae.safetensors` with
`encoder.weight [F, d]` (our `W_enc` transposed), `encoder.bias [F]`, `W_dec [F, d]` and
`b_dec [d]`. sparsify encodes `topk(relu((x - b_dec) @ encoder.weight.T + encoder.bias))`
and decodes `f @ W_dec + b_dec`, which is our TopK SAE with `apply_b_dec_to_input`.
Transcoders, skip connections and non-TopK activations have no TopK-SAE equivalent and
are rejected. The folder name (the hookpoint, e.g. `layers.6`) gives the hook name.
"""

from __future__ import annotations

from pathlib import Path

import torch

from saes.formats.common import (
    assemble_sae,
    check_d_in,
    dtype_name,
    make_config,
    read_config,
    read_safetensors,
    reject_unknown,
    take,
)
from saes.formats.foreign_hooks import hook_from_module
from saes.sae.base import SAE
from store.errors import IntegrityError, InvalidInputError

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae.safetensors"
_REPAIR = "re-download or re-export the sparsify checkpoint folder"


def is_sparsify_folder(folder: Path) -> bool:
    """Whether `folder` looks like a sparsify sparse-coder folder."""
    return (folder / WEIGHTS_FILE).is_file() and (folder / CFG_FILE).is_file()


def _width(raw: dict, cfg_path: Path) -> tuple[int, int, int]:
    try:
        d_in = int(raw["d_in"])
        k = int(raw["k"])
        num_latents = int(raw.get("num_latents") or 0) or d_in * int(raw["expansion_factor"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(
            cfg_path, f"needs integer d_in, k and num_latents or expansion_factor ({exc!r})", _REPAIR
        ) from exc
    return d_in, num_latents, k


def load_sparsify(
    folder: str | Path, *, expected_d_in: int | None = None, device: str | torch.device = "cpu"
) -> SAE:
    """Load a sparsify sparse-coder folder as a TopK SAE (eval mode)."""
    folder = Path(folder)
    cfg_path = folder / CFG_FILE
    raw = read_config(cfg_path, _REPAIR)
    for flag in ("transcode", "skip_connection", "signed", "embed_skip", "gram_lookup"):
        if raw.get(flag):
            raise InvalidInputError(f"{cfg_path}: sparsify option {flag}=true is not supported")
    if raw.get("activation", "topk") != "topk":
        raise InvalidInputError(f"{cfg_path}: activation {raw['activation']!r} is not supported (only topk)")
    d_in, d_sae, k = _width(raw, cfg_path)
    weights_path = folder / WEIGHTS_FILE
    tensors = read_safetensors(weights_path, _REPAIR)
    reject_unknown(tensors, {"encoder.weight", "encoder.bias", "W_dec", "b_dec"}, weights_path)
    encoder = take(tensors, ["encoder.weight"], (d_sae, d_in), weights_path, _REPAIR)
    state = {
        "W_enc": encoder.T.contiguous(),
        "b_enc": take(tensors, ["encoder.bias"], (d_sae,), weights_path, _REPAIR),
        "W_dec": take(tensors, ["W_dec"], (d_sae, d_in), weights_path, _REPAIR),
        "b_dec": take(tensors, ["b_dec"], (d_in,), weights_path, _REPAIR),
    }
    cfg = make_config(
        cfg_path,
        architecture="topk",
        d_in=d_in,
        d_sae=d_sae,
        k=k,
        apply_b_dec_to_input=True,
        dtype=dtype_name(encoder.dtype, weights_path),
        hook_name=hook_from_module(folder.name),
    )
    return check_d_in(assemble_sae(cfg, state, weights_path, _REPAIR, device), expected_d_in, cfg_path)
