"""Import dictionary_learning (saprmarks) dictionaries: `ae.pt` plus `config.json`.

`ae.pt` is a `torch.save`d state dict; `config.json` holds `trainer.dict_class`,
`trainer.k`, `trainer.lm_name`, `trainer.submodule_name` and `buffer.ctx_len`. The
dictionary classes and what they become:

| dict_class | tensors | ours |
|---|---|---|
| AutoEncoder | `encoder.weight [F,d]`, `encoder.bias`, `decoder.weight [d,F]`, `bias` (subtracted from the input) | standard |
| AutoEncoderNew | as above with `decoder.bias` (not subtracted) | standard, no input bias |
| AutoEncoderTopK | `encoder.*`, `decoder.weight`, `b_dec`, `k`, `threshold` (unused at inference) | topk |
| BatchTopKSAE | as TopK; inference `relu(pre) * (relu(pre) > threshold)` | batchtopk |
| MatryoshkaBatchTopKSAE | `W_enc [d,F]`, `b_enc`, `W_dec [F,d]`, `b_dec`, `k`, `threshold`, `group_sizes` | matryoshka |
| JumpReluAutoEncoder | `W_enc`, `b_enc`, `W_dec`, `b_dec`, `threshold [F]`; code scaled by `||W_dec_i||` | jumprelu (norms folded) |

Without `config.json` the class is inferred from the tensor names where that is
unambiguous. A scalar threshold below 0 (never set during training) lets every positive
value through, the same as a threshold of 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.formats.assembly import (
    assemble_sae,
    check_d_in,
    dtype_name,
    fold_decoder_norms,
    make_config,
    read_config,
    read_torch_state,
    reject_unknown,
    take,
)
from sae_atlas.saes.formats.foreign_hooks import hook_from_module
from sae_atlas.saes.sae.base import SAE

WEIGHTS_FILE = "ae.pt"
CONFIG_FILE = "config.json"
_REPAIR = "re-download or re-export the dictionary_learning checkpoint (ae.pt + config.json)"
_BIAS_NAMES = ("b_dec", "bias", "decoder_bias")
SUPPORTED = ("AutoEncoder", "AutoEncoderNew", "AutoEncoderTopK", "BatchTopKSAE",
             "MatryoshkaBatchTopKSAE", "JumpReluAutoEncoder")


def is_dictionary_learning_folder(folder: Path) -> bool:
    """Whether `folder` holds a dictionary_learning `ae.pt`."""
    return (folder / WEIGHTS_FILE).is_file()


def _infer_class(state: dict[str, torch.Tensor], path: Path) -> str:
    if "W_enc" in state:
        return "MatryoshkaBatchTopKSAE" if "group_sizes" in state else "JumpReluAutoEncoder"
    if "k" in state:
        raise InvalidInputError(
            f"{path}: a top-k dictionary without {CONFIG_FILE}: AutoEncoderTopK and BatchTopKSAE "
            "store the same tensors; add the config.json written by dictionary_learning"
        )
    if "decoder.bias" in state:
        return "AutoEncoderNew"
    if "encoder.weight" in state and any(n in state for n in _BIAS_NAMES):
        return "AutoEncoder"
    raise InvalidInputError(f"{path}: unrecognised dictionary tensors {sorted(state)}")


def _matrix(state: dict[str, torch.Tensor], name: str, path: Path) -> torch.Tensor:
    if name not in state:
        raise IntegrityError(path, f"tensor {name!r} is missing (has: {', '.join(sorted(state))})", _REPAIR)
    if state[name].dim() != 2:
        raise IntegrityError(path, f"tensor {name!r} has shape {tuple(state[name].shape)}, expected a matrix", _REPAIR)
    return state[name]


def _linear_state(state: dict[str, torch.Tensor], path: Path, bias_names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    d_sae, d_in = _matrix(state, "encoder.weight", path).shape
    return {
        "W_enc": state["encoder.weight"].T.contiguous(),
        "b_enc": take(state, ["encoder.bias"], (d_sae,), path, _REPAIR),
        "W_dec": take(state, ["decoder.weight"], (d_in, d_sae), path, _REPAIR).T.contiguous(),
        "b_dec": take(state, bias_names, (d_in,), path, _REPAIR),
    }


def _param_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    d_in, d_sae = _matrix(state, "W_enc", path).shape
    return {
        "W_enc": state["W_enc"],
        "b_enc": take(state, ["b_enc"], (d_sae,), path, _REPAIR),
        "W_dec": take(state, ["W_dec"], (d_sae, d_in), path, _REPAIR),
        "b_dec": take(state, ["b_dec"], (d_in,), path, _REPAIR),
    }


def _k(state: dict[str, torch.Tensor], trainer: dict[str, Any], path: Path) -> int:
    if "k" in state:
        return int(state["k"].item())
    if trainer.get("k") is not None:
        return int(trainer["k"])
    raise IntegrityError(path, "a top-k dictionary without a 'k' buffer or trainer.k", _REPAIR)


def _convert(dict_class: str, state: dict[str, torch.Tensor], trainer: dict[str, Any], path: Path) -> tuple[dict, dict]:
    """(our config fields, our state dict) for one dictionary class."""
    if dict_class == "AutoEncoder":
        reject_unknown(state, {"encoder.weight", "encoder.bias", "decoder.weight", *_BIAS_NAMES}, path)
        return {"architecture": "standard"}, _linear_state(state, path, _BIAS_NAMES)
    if dict_class == "AutoEncoderNew":
        reject_unknown(state, {"encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"}, path)
        fields = {"architecture": "standard", "apply_b_dec_to_input": False}
        return fields, _linear_state(state, path, ("decoder.bias",))
    if dict_class in ("AutoEncoderTopK", "BatchTopKSAE"):
        reject_unknown(state, {"encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "k", "threshold"}, path)
        ours = _linear_state(state, path, ("b_dec",))
        if dict_class == "AutoEncoderTopK":
            return {"architecture": "topk", "k": _k(state, trainer, path)}, ours
        threshold = take(state, ["threshold"], (), path, _REPAIR).float().clamp_min(0)
        ours["threshold"] = threshold.expand(ours["b_enc"].shape[0]).clone()
        return {"architecture": "batchtopk", "k": _k(state, trainer, path)}, ours
    if dict_class == "MatryoshkaBatchTopKSAE":
        reject_unknown(state, {"W_enc", "b_enc", "W_dec", "b_dec", "k", "threshold", "group_sizes"}, path)
        ours = _param_state(state, path)
        threshold = take(state, ["threshold"], (), path, _REPAIR).float().clamp_min(0)
        ours["threshold"] = threshold.expand(ours["b_enc"].shape[0]).clone()
        prefixes = torch.cumsum(state["group_sizes"].long(), 0).tolist()
        return {"architecture": "matryoshka", "k": _k(state, trainer, path), "matryoshka_prefixes": prefixes}, ours
    if dict_class == "JumpReluAutoEncoder":
        reject_unknown(state, {"W_enc", "b_enc", "W_dec", "b_dec", "threshold"}, path)
        ours = _param_state(state, path)
        ours["threshold"] = take(state, ["threshold"], tuple(ours["b_enc"].shape), path, _REPAIR).float().clamp_min(0)
        ours = fold_decoder_norms(ours, ["W_enc", "b_enc", "threshold"])
        ours["log_threshold"] = ours.pop("threshold").log()
        return {"architecture": "jumprelu", "apply_b_dec_to_input": False}, ours
    raise InvalidInputError(
        f"{path}: dictionary class {dict_class!r} is not supported; supported: {', '.join(SUPPORTED)}"
    )


def load_dictionary_learning(
    folder: str | Path, *, expected_d_in: int | None = None, device: str | torch.device = "cpu"
) -> SAE:
    """Load a dictionary_learning `ae.pt` (+ `config.json`) folder as one of our SAEs (eval mode)."""
    folder = Path(folder)
    path = folder / WEIGHTS_FILE
    state = read_torch_state(path, _REPAIR)
    config = read_config(folder / CONFIG_FILE, _REPAIR) if (folder / CONFIG_FILE).exists() else {}
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    buffer = config.get("buffer") if isinstance(config.get("buffer"), dict) else {}
    dict_class = str(trainer.get("dict_class") or _infer_class(state, path))
    fields, ours = _convert(dict_class, state, trainer, path)
    d_sae, d_in = ours["W_dec"].shape
    cfg = make_config(
        path,
        d_in=int(d_in),
        d_sae=int(d_sae),
        dtype=dtype_name(ours["W_enc"].dtype, path),
        model_name=str(trainer.get("lm_name") or ""),
        hook_name=hook_from_module(trainer.get("submodule_name")),
        context_size=int(buffer.get("ctx_len") or 0),
        **fields,
    )
    return check_d_in(assemble_sae(cfg, ours, path, _REPAIR, device), expected_d_in, path)
