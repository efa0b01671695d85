"""Import Llama Scope JumpReLU SAEs: `hyperparams.json` + `checkpoints/final.safetensors`.

`hyperparams.json` holds `d_model`, `d_sae`, `hook_point_in`, `hook_point_out`,
`jump_relu_threshold` (one scalar for every latent) and
`dataset_average_activation_norm: {in, out}`; the weights are `encoder.weight [F, d]`,
`encoder.bias [F]`, `decoder.weight [d, F]` and `decoder.bias [d]`. The SAE was trained on
inputs normalised dataset-wise (`normalize_activations="expected_average_only_in"`): the
input is multiplied by `s = sqrt(d_model) / average_norm_in`, the code is
`pre * (pre > jump_relu_threshold * s)` with `pre = (s x) @ W_enc + b_enc` (no input bias),
and the reconstruction is divided by `s` again. This is the reading SAELens' Llama Scope
loader makes; `s` is folded into the weights (`W_enc * s`, `W_dec / s`, `b_dec / s`), so the
stored SAE works on raw activations with no run-time normalisation. Transcoders
(`hook_point_in != hook_point_out`) are rejected.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.formats.assembly import (
    assemble_sae,
    check_d_in,
    dtype_name,
    fold_norm_scaling,
    make_config,
    read_config,
    read_safetensors,
    reject_unknown,
    take,
)
from sae_atlas.saes.sae.base import SAE

CONFIG_FILE = "hyperparams.json"
WEIGHT_FILES = ("checkpoints/final.safetensors", "final.safetensors")
_REPAIR = "re-download the Llama Scope folder (hyperparams.json + checkpoints/final.safetensors)"


def is_llama_scope_folder(folder: Path) -> bool:
    """Whether `folder` holds a Llama Scope `hyperparams.json`."""
    return (folder / CONFIG_FILE).is_file()


def _weights_path(folder: Path) -> Path:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise IntegrityError(folder / WEIGHT_FILES[0], "file is missing", _REPAIR)


def _number(raw: dict, key: str, cfg_path: Path) -> float:
    value = raw.get(key)
    if isinstance(value, dict):
        value = value.get("in")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise IntegrityError(cfg_path, f"needs a number {key!r}, got {value!r}", _REPAIR)
    return float(value)


def load_llama_scope(
    folder: str | Path, *, expected_d_in: int | None = None, device: str | torch.device = "cpu"
) -> SAE:
    """Load a Llama Scope folder as a JumpReLU SAE on raw activations (eval mode)."""
    folder = Path(folder)
    cfg_path = folder / CONFIG_FILE
    raw = read_config(cfg_path, _REPAIR)
    hook_in, hook_out = raw.get("hook_point_in"), raw.get("hook_point_out", raw.get("hook_point_in"))
    if hook_in != hook_out:
        raise InvalidInputError(f"{cfg_path}: a transcoder ({hook_in} -> {hook_out}) is not an SAE; not supported")
    if raw.get("act_fn", "jumprelu") != "jumprelu":
        raise InvalidInputError(f"{cfg_path}: act_fn {raw['act_fn']!r} is not supported (only jumprelu)")
    d_in, d_sae = int(_number(raw, "d_model", cfg_path)), int(_number(raw, "d_sae", cfg_path))
    average_norm = _number(raw, "dataset_average_activation_norm", cfg_path)
    if average_norm <= 0:
        raise IntegrityError(cfg_path, f"dataset_average_activation_norm.in must be positive, got {average_norm}", _REPAIR)
    scale = d_in**0.5 / average_norm
    path = _weights_path(folder)
    tensors = read_safetensors(path, _REPAIR)
    reject_unknown(tensors, {"encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"}, path)
    dtype = dtype_name(take(tensors, ["encoder.weight"], (d_sae, d_in), path, _REPAIR).dtype, path)
    threshold = _number(raw, "jump_relu_threshold", cfg_path) * scale
    state = fold_norm_scaling({
        "W_enc": tensors["encoder.weight"].float().T,
        "b_enc": take(tensors, ["encoder.bias"], (d_sae,), path, _REPAIR).float(),
        "W_dec": take(tensors, ["decoder.weight"], (d_in, d_sae), path, _REPAIR).float().T,
        "b_dec": take(tensors, ["decoder.bias"], (d_in,), path, _REPAIR).float(),
        "log_threshold": torch.full((d_sae,), math.log(threshold) if threshold > 0 else -math.inf),
    }, scale)
    cfg = make_config(cfg_path, architecture="jumprelu", d_in=d_in, d_sae=d_sae,
                      apply_b_dec_to_input=bool(raw.get("apply_decoder_bias_to_pre_encoder", False)),
                      dtype=dtype, model_name=str(raw.get("model_name") or "meta-llama/Llama-3.1-8B"),
                      hook_name=str(hook_in or ""), context_size=1024,
                      dataset_path="cerebras/SlimPajama-627B")
    state = {k: v.contiguous() for k, v in state.items()}
    return check_d_in(assemble_sae(cfg, state, path, _REPAIR, device), expected_d_in, cfg_path)
