"""Import circuit-tracer per-layer transcoders (Hanna, Piotrowski et al. 2025, circuit-tracer;
Ameisen et al. 2025, "Circuit Tracing").

A circuit-tracer transcoder set is a folder with a `config.yaml` (`model_kind:
transcoder_set`, `model_name`, `feature_input_hook` and `feature_output_hook` naming hooks
inside a block, e.g. `ln2.hook_normalized` and `hook_mlp_out`, and optionally
`transcoders`, one file per layer in layer order) beside the layers' safetensors files
(by default `layer_<i>.safetensors`). Each layer file holds `W_enc [d_transcoder, d_model]`
(an `nn.Linear` weight: our `W_enc` transposed), `b_enc`, `W_dec [d_transcoder, d_model]`,
`b_dec` and optionally `W_skip [d_model, d_model]`, applied as `x @ W_skip.T`. The code is
`relu(x @ W_enc.T + b_enc)` without an input bias and the output `f @ W_dec + b_dec (+ skip)`,
which is our `standard` transcoder (`apply_b_dec_to_input=False`). A file with a JumpReLU
threshold (`activation_function.threshold`, code `z * (z > threshold)`) loads as our
`jumprelu` transcoder; a negative threshold (it would let negative values through) is
refused.

One layer is imported at a time: its safetensors file is the source, and the layer is its
position in `transcoders` or the number in `layer_<i>.safetensors`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.formats.assembly import (
    assemble_sae,
    check_d_in,
    dtype_name,
    make_config,
    read_safetensors,
    reject_unknown,
    take,
)
from sae_atlas.saes.sae.base import SAE

CONFIG_FILE = "config.yaml"
_REPAIR = "re-download the circuit-tracer transcoder set (config.yaml and the layer files)"
_LAYER_FILE = re.compile(r"^layer_(\d+)\.safetensors$")
THRESHOLD = "activation_function.threshold"


def read_transcoder_set_config(folder: Path) -> dict[str, Any]:
    """The `config.yaml` of a circuit-tracer transcoder set (IntegrityError if unreadable)."""
    import yaml

    path = folder / CONFIG_FILE
    if not path.is_file():
        raise IntegrityError(path, "file is missing (a circuit-tracer layer file needs its set's config)", _REPAIR)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise IntegrityError(path, f"not valid YAML ({exc})", _REPAIR) from exc
    if not isinstance(data, dict):
        raise IntegrityError(path, "expected a mapping", _REPAIR)
    return data


def is_circuit_tracer_file(path: Path) -> bool:
    """Whether `path` is a safetensors layer file of a circuit-tracer transcoder set."""
    if not (path.is_file() and path.suffix == ".safetensors" and (path.parent / CONFIG_FILE).is_file()):
        return False
    try:
        return read_transcoder_set_config(path.parent).get("model_kind") == "transcoder_set"
    except IntegrityError:
        return False


def _layer(path: Path, config: dict[str, Any]) -> int:
    """The layer of a set's file: its position in `transcoders`, else its `layer_<i>` name."""
    listed = [Path(str(p)).name for p in config.get("transcoders") or []]
    if path.name in listed:
        return listed.index(path.name)
    match = _LAYER_FILE.match(path.name)
    if match is None:
        raise InvalidInputError(f"{path}: not listed in {CONFIG_FILE}'s transcoders and not named "
                                "layer_<i>.safetensors; cannot tell which layer it transcodes")
    return int(match.group(1))


def _hook(template: Any, layer: int, key: str, cfg_path: Path) -> str:
    if not isinstance(template, str) or not template:
        raise IntegrityError(cfg_path, f"needs {key} (the hook the transcoders read / write)", _REPAIR)
    if "{layer}" in template:
        return template.format(layer=layer)
    return template if template.startswith("blocks.") else f"blocks.{layer}.{template}"


def load_circuit_tracer(
    path: str | Path, *, expected_d_in: int | None = None, device: str | torch.device = "cpu"
) -> SAE:
    """Load one layer file of a circuit-tracer transcoder set as a transcoder (eval mode)."""
    path = Path(path)
    config = read_transcoder_set_config(path.parent)
    cfg_path = path.parent / CONFIG_FILE
    if config.get("model_kind") != "transcoder_set":
        raise InvalidInputError(f"{cfg_path}: model_kind {config.get('model_kind')!r} is not supported "
                                "(only per-layer transcoder sets, 'transcoder_set')")
    layer = _layer(path, config)
    tensors = read_safetensors(path, _REPAIR)
    jumprelu = THRESHOLD in tensors
    reject_unknown(tensors, {"W_enc", "b_enc", "W_dec", "b_dec", "W_skip", *([THRESHOLD] if jumprelu else [])}, path)
    if "b_enc" not in tensors or "b_dec" not in tensors:
        raise IntegrityError(path, f"needs b_enc and b_dec (has: {', '.join(sorted(tensors))})", _REPAIR)
    d_sae, d_model = tensors["b_enc"].shape[0], tensors["b_dec"].shape[0]
    encoder = take(tensors, ["W_enc"], (d_sae, d_model), path, _REPAIR)
    state = {"W_enc": encoder.T.contiguous(), "b_enc": tensors["b_enc"],
             "W_dec": take(tensors, ["W_dec"], (d_sae, d_model), path, _REPAIR), "b_dec": tensors["b_dec"]}
    skip = "W_skip" in tensors
    if skip:
        state["W_skip"] = take(tensors, ["W_skip"], (d_model, d_model), path, _REPAIR).T.contiguous()
    if jumprelu:
        threshold = take(tensors, [THRESHOLD], (d_sae,), path, _REPAIR).float()
        if bool((threshold < 0).any()):
            raise InvalidInputError(f"{path}: negative JumpReLU thresholds let negative activations through, "
                                    "which our JumpReLU (threshold > 0) cannot represent")
        state["log_threshold"] = threshold.log()  # a 0 threshold is a ReLU
    cfg = make_config(
        cfg_path,
        architecture="jumprelu" if jumprelu else "standard",
        d_in=d_model,
        d_sae=d_sae,
        apply_b_dec_to_input=False,
        dtype=dtype_name(encoder.dtype, path),
        model_name=str(config.get("model_name") or ""),
        hook_name=_hook(config.get("feature_input_hook"), layer, "feature_input_hook", cfg_path),
        hook_name_out=_hook(config.get("feature_output_hook"), layer, "feature_output_hook", cfg_path),
        d_out=d_model,
        skip=skip,
    )
    return check_d_in(assemble_sae(cfg, state, path, _REPAIR, device), expected_d_in, path)
