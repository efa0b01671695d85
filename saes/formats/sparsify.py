"""Import EleutherAI sparsify sparse coders (one folder per hookpoint) as TopK SAEs.

A folder holds `cfg.json` (`d_in`, `num_latents` or `expansion_factor`, `k`,
`activation`, `transcode`, `skip_connection`, ...) and `sae.safetensors` with
`encoder.weight [F, d]` (our `W_enc` transposed), `encoder.bias [F]`, `W_dec [F, d]` and
`b_dec [d]`. sparsify encodes `topk(relu((x - b_dec) @ encoder.weight.T + encoder.bias))`
and decodes `f @ W_dec + b_dec`, which is our TopK SAE with `apply_b_dec_to_input`.
The folder name (the hookpoint, e.g. `layers.6`) gives the hook name.

A `transcode=true` coder (`sparsify --transcode`) reads the hookpoint module's input and
predicts its output without subtracting `b_dec`, optionally with `skip_connection`
(`W_skip [d, d]`, added as `x @ W_skip.T`): our TopK transcoder from the module's input
hook (`layers.6.mlp`: `blocks.6.mlp.hook_in`) to its output hook (`blocks.6.hook_mlp_out`).
A skip connection without transcoding, and non-TopK activations, are rejected.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.formats.assembly import (
    assemble_sae,
    check_d_in,
    dtype_name,
    make_config,
    read_config,
    read_safetensors,
    reject_unknown,
    take,
)
from sae_atlas.saes.formats.foreign_hooks import hook_from_module, module_input_hook
from sae_atlas.saes.sae.base import SAE

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
    transcode, skip = bool(raw.get("transcode")), bool(raw.get("skip_connection"))
    for flag in ("signed", "embed_skip", "gram_lookup"):
        if raw.get(flag):
            raise InvalidInputError(f"{cfg_path}: sparsify option {flag}=true is not supported")
    if skip and not transcode:
        raise InvalidInputError(f"{cfg_path}: sparsify option skip_connection=true without transcode is not supported")
    if raw.get("activation", "topk") != "topk":
        raise InvalidInputError(f"{cfg_path}: activation {raw['activation']!r} is not supported (only topk)")
    d_in, d_sae, k = _width(raw, cfg_path)
    weights_path = folder / WEIGHTS_FILE
    tensors = read_safetensors(weights_path, _REPAIR)
    reject_unknown(tensors, {"encoder.weight", "encoder.bias", "W_dec", "b_dec", *(["W_skip"] if skip else [])},
                   weights_path)
    encoder = take(tensors, ["encoder.weight"], (d_sae, d_in), weights_path, _REPAIR)
    state = {
        "W_enc": encoder.T.contiguous(),
        "b_enc": take(tensors, ["encoder.bias"], (d_sae,), weights_path, _REPAIR),
        "W_dec": take(tensors, ["W_dec"], (d_sae, d_in), weights_path, _REPAIR),
        "b_dec": take(tensors, ["b_dec"], (d_in,), weights_path, _REPAIR),
    }
    if skip:
        state["W_skip"] = take(tensors, ["W_skip"], (d_in, d_in), weights_path, _REPAIR).T.contiguous()
    hook_out = hook_from_module(folder.name)
    if transcode and not (hook_out and module_input_hook(folder.name)):
        raise InvalidInputError(f"{cfg_path}: a transcoder on hookpoint {folder.name!r}: only a decoder layer "
                                "(layers.L) or its MLP (layers.L.mlp) maps to a pair of hooks")
    cfg = make_config(
        cfg_path,
        architecture="topk",
        d_in=d_in,
        d_sae=d_sae,
        k=k,
        apply_b_dec_to_input=not transcode,
        dtype=dtype_name(encoder.dtype, weights_path),
        hook_name=module_input_hook(folder.name) if transcode else hook_out,
        hook_name_out=hook_out if transcode else "",
        d_out=d_in if transcode else None,
        skip=skip,
    )
    return check_d_in(assemble_sae(cfg, state, weights_path, _REPAIR, device), expected_d_in, cfg_path)
