"""Shared pieces of the SAE file readers: checked file reads, tensor checks, assembly.

Every reader turns a foreign layout into our `SAEConfig` plus a state dict for the
matching `saes.sae` architecture, then calls `assemble_sae`. Problems with a file raise
`IntegrityError` naming the file; settings we cannot represent exactly raise
`InvalidInputError` saying what is unsupported.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.sae.base import SAE, SAEConfig, architecture_class
from sae_atlas.store.atomic import read_json
from sae_atlas.store.dtypes import DTYPES, dtype_name  # noqa: F401 (the format readers' dtype helpers)


def read_config(path: Path, repair: str) -> dict[str, Any]:
    """A JSON object from `path` (IntegrityError if missing, corrupt or not an object)."""
    data = read_json(path, repair)
    if not isinstance(data, dict):
        raise IntegrityError(path, "expected a JSON object", repair)
    return data


def read_safetensors(path: Path, repair: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, or IntegrityError if missing, truncated or corrupt."""
    if not path.is_file():
        raise IntegrityError(path, "file is missing", repair)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise IntegrityError(path, f"not a readable safetensors file ({exc})", repair) from exc


def read_torch_state(path: Path, repair: str) -> dict[str, torch.Tensor]:
    """A tensor state dict saved with `torch.save` (loaded with `weights_only=True`)."""
    if not path.is_file():
        raise IntegrityError(path, "file is missing", repair)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError, OSError, ValueError, pickle.UnpicklingError) as exc:
        raise IntegrityError(path, f"not a readable torch state dict ({exc})", repair) from exc
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise IntegrityError(path, "expected a dict of tensors", repair)
    return dict(state)


def take(
    tensors: Mapping[str, torch.Tensor],
    names: Sequence[str],
    shape: tuple[int, ...],
    path: Path,
    repair: str,
) -> torch.Tensor:
    """The first tensor present under one of `names`, checked to have `shape`."""
    for name in names:
        if name in tensors:
            tensor = tensors[name]
            if tuple(tensor.shape) != shape:
                hint = (" (it looks transposed: W_enc is [d_in, d_sae] and W_dec [d_sae, d_in]; "
                        "an nn.Linear weight is stored [out, in])" if tuple(tensor.shape) == shape[::-1] else "")
                raise IntegrityError(
                    path, f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}{hint}", repair
                )
            return tensor
    listed = " or ".join(repr(n) for n in names)
    raise IntegrityError(path, f"tensor {listed} is missing (has: {', '.join(sorted(tensors))})", repair)


def reject_unknown(tensors: Mapping[str, torch.Tensor], known: set[str], path: Path) -> None:
    """InvalidInputError if the file holds tensors whose meaning we would silently drop."""
    unknown = sorted(set(tensors) - known)
    if unknown:
        raise InvalidInputError(
            f"{path}: unsupported tensors {unknown} (this SAE variant is not supported; "
            f"understood: {', '.join(sorted(known))})"
        )


def make_config(path: Path, **fields: Any) -> SAEConfig:
    """`SAEConfig(**fields)`, with a validation error prefixed by the file it came from."""
    try:
        return SAEConfig(**fields)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{path}: {exc}") from exc


def fold_decoder_norms(state: dict[str, torch.Tensor], scaled: Sequence[str]) -> dict[str, torch.Tensor]:
    """Rewrite a code that multiplies latents by `||W_dec_i||` (and divides before decoding)
    as plain weights: the tensors in `scaled` (encoder side, thresholds) times the norms,
    `W_dec` rows divided by them. Outputs and code values are unchanged."""
    norms = state["W_dec"].norm(dim=-1)
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    out = dict(state)
    for name in scaled:
        out[name] = state[name] * (norms if state[name].dim() == 1 else norms[None, :])
    out["W_dec"] = state["W_dec"] / safe[:, None]
    return out


def fold_norm_scaling(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Weights of an SAE trained on `scale * x` (and reconstructing `scale * x`) rewritten to
    work on raw `x`: `W_enc * scale`, `W_dec / scale`, `b_dec / scale` (SAELens'
    `fold_activation_norm_scaling_factor`); thresholds and `b_enc` are unchanged."""
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidInputError(f"norm_scaling_factor must be a positive number, got {scale!r}")
    return {**state, "W_enc": state["W_enc"] * scale, "W_dec": state["W_dec"] / scale,
            "b_dec": state["b_dec"] / scale}


def state_shapes(cfg: SAEConfig) -> dict[str, tuple[int, ...]]:
    """The state-dict entries of an SAE for `cfg` and their shapes (the SAE is built on
    the meta device, so nothing is allocated)."""
    with torch.device("meta"):
        sae = architecture_class(cfg.architecture)(cfg)
    return {name: tuple(tensor.shape) for name, tensor in sae.state_dict().items()}


def assemble_sae(
    cfg: SAEConfig, state: Mapping[str, torch.Tensor], path: Path, repair: str, device: str | torch.device
) -> SAE:
    """An SAE of `cfg.architecture` holding exactly `state`, in eval mode on `device`."""
    sae = architecture_class(cfg.architecture)(cfg).to(DTYPES[cfg.dtype])
    try:
        sae.load_state_dict({k: v.to(DTYPES[cfg.dtype]) for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        raise IntegrityError(path, f"tensors do not fit a {cfg.architecture} SAE ({exc})", repair) from exc
    return sae.to(device).eval()


def check_d_in(sae: SAE, expected_d_in: int | None, path: Path) -> SAE:
    """Return `sae`, or InvalidInputError if its d_in differs from the target hook's width."""
    if expected_d_in is not None and sae.cfg.d_in != expected_d_in:
        raise InvalidInputError(
            f"{path}: SAE has d_in={sae.cfg.d_in} but the target hook has d_model={expected_d_in}; "
            "use an SAE trained on that hook"
        )
    return sae
