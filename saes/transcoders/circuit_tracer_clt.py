"""Read circuit-tracer cross-layer transcoders (Hanna, Piotrowski et al. 2025, circuit-tracer;
layout of `circuit_tracer/transcoder/cross_layer_transcoder.py`, `load_clt`, as of
circuit-tracer 0.5.0 / decoderesearch/circuit-tracer d57d98ac).

A CLT folder holds `config.yaml` (`model_kind: cross_layer_transcoder`, `model_name`,
`feature_input_hook` and `feature_output_hook`, hooks inside a block such as
`hook_resid_mid` and `hook_mlp_out`) and, for every layer i of 0..L-1 (L = the number of
`W_enc_*.safetensors` files):

- `W_enc_{i}.safetensors`: `W_enc_{i} [F, d_model]` (applied as `x @ W_enc_i.T`: our
  `W_enc[i]` transposed), `b_enc_{i} [F]`, `b_dec_{i} [d_model]` and, for JumpReLU,
  `threshold_{i} [F]` (code `z * (z > threshold)`; without thresholds the code is a ReLU);
- `W_dec_{i}.safetensors`: `W_dec_{i} [F, L - i, d_model]`, the decoder of layer i's
  features to layers i..L-1 (our layout).

The result is our JumpReLU `CrossLayerTranscoder` (a ReLU is a zero threshold). A folder
with missing layer files, a tensor of the wrong shape, negative thresholds or tensors we
would drop (a skip connection) is refused by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.formats.assembly import dtype_name, read_safetensors, reject_unknown, take
from sae_atlas.saes.formats.circuit_tracer import CONFIG_FILE, read_transcoder_set_config
from sae_atlas.saes.transcoders.clt import CLTConfig, CrossLayerTranscoder, build_clt

MODEL_KIND = "cross_layer_transcoder"
DEFAULT_INPUT, DEFAULT_OUTPUT = "hook_resid_mid", "hook_mlp_out"  # circuit-tracer's load_clt defaults
_REPAIR = "re-download the circuit-tracer CLT (config.yaml and every W_enc_<i> / W_dec_<i> file)"
_ENC_FILE = re.compile(r"^W_enc_(\d+)\.safetensors$")


def is_circuit_tracer_clt(folder: Path) -> bool:
    """Whether `folder` is a circuit-tracer CLT (its config.yaml's model_kind says so)."""
    if not (folder.is_dir() and (folder / CONFIG_FILE).is_file()):
        return False
    try:
        return read_transcoder_set_config(folder).get("model_kind") == MODEL_KIND
    except IntegrityError:
        return False


def _site(value: Any, default: str, key: str, cfg_path: Path) -> str:
    """The hook inside a block a config names (`hook_resid_mid`; `blocks.{layer}.x` and
    `blocks.0.x` spellings reduce to `x`)."""
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise IntegrityError(cfg_path, f"{key} must name a hook inside a block, got {value!r}", _REPAIR)
    return re.sub(r"^blocks\.(\{layer\}|\d+)\.", "", value)


def _n_layers(folder: Path) -> int:
    layers = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _ENC_FILE.match(p.name)))
    if not layers:
        raise IntegrityError(folder / "W_enc_0.safetensors", "file is missing: a circuit-tracer CLT has one "
                             "W_enc_<i>.safetensors per layer", _REPAIR)
    missing = sorted(set(range(layers[-1] + 1)) - set(layers))
    if missing:
        raise IntegrityError(folder / f"W_enc_{missing[0]}.safetensors", f"file is missing (have layers "
                             f"{layers}; a CLT needs W_enc_<i> for every layer 0..{layers[-1]})", _REPAIR)
    return len(layers)


def load_circuit_tracer_clt(folder: str | Path) -> CrossLayerTranscoder:
    """The circuit-tracer CLT in `folder` as our `CrossLayerTranscoder` (eval mode, cpu)."""
    folder = Path(folder)
    config = read_transcoder_set_config(folder)
    cfg_path = folder / CONFIG_FILE
    if config.get("model_kind") != MODEL_KIND:
        raise InvalidInputError(f"{cfg_path}: model_kind {config.get('model_kind')!r} is not {MODEL_KIND!r}")
    if config.get("transcoders"):
        raise InvalidInputError(f"{cfg_path} lists per-layer files under `transcoders`: that is the Gemma Scope 2 "
                                "CLT layout (w_enc / w_dec / affine_skip_connection per layer), which is not "
                                "supported; only circuit-tracer's W_enc_<i> / W_dec_<i>.safetensors layout is")
    L = _n_layers(folder)
    enc = [read_safetensors(folder / f"W_enc_{i}.safetensors", _REPAIR) for i in range(L)]
    if "b_enc_0" not in enc[0] or "b_dec_0" not in enc[0]:
        raise IntegrityError(folder / "W_enc_0.safetensors", f"needs b_enc_0 and b_dec_0 (has: "
                             f"{', '.join(sorted(enc[0]))})", _REPAIR)
    F, d = enc[0]["b_enc_0"].shape[0], enc[0]["b_dec_0"].shape[0]
    jumprelu = "threshold_0" in enc[0]
    W_enc, b_enc, b_dec, threshold, W_dec = [], [], [], [], []
    for i, tensors in enumerate(enc):
        path = folder / f"W_enc_{i}.safetensors"
        names = [f"W_enc_{i}", f"b_enc_{i}", f"b_dec_{i}", *([f"threshold_{i}"] if jumprelu else [])]
        reject_unknown(tensors, set(names), path)
        W_enc.append(take(tensors, [names[0]], (F, d), path, _REPAIR).T)
        b_enc.append(take(tensors, [names[1]], (F,), path, _REPAIR))
        b_dec.append(take(tensors, [names[2]], (d,), path, _REPAIR))
        if jumprelu:
            threshold.append(take(tensors, [names[3]], (F,), path, _REPAIR))
        dec_path = folder / f"W_dec_{i}.safetensors"
        dec = read_safetensors(dec_path, _REPAIR)
        reject_unknown(dec, {f"W_dec_{i}"}, dec_path)
        W_dec.append(take(dec, [f"W_dec_{i}"], (F, L - i, d), dec_path, _REPAIR))
    thresholds = torch.stack(threshold).float() if jumprelu else torch.zeros(L, F)
    if bool((thresholds < 0).any()):
        raise InvalidInputError(f"{folder}: negative JumpReLU thresholds let negative activations through, "
                                "which our JumpReLU (threshold >= 0) cannot represent")
    try:
        cfg = CLTConfig(architecture="jumprelu", n_layers=L, d_model=d, d_sae=F,
                        dtype=dtype_name(W_enc[0].dtype, folder / "W_enc_0.safetensors"),
                        model_name=str(config.get("model_name") or ""),
                        input_site=_site(config.get("feature_input_hook"), DEFAULT_INPUT, "feature_input_hook",
                                         cfg_path),
                        output_site=_site(config.get("feature_output_hook"), DEFAULT_OUTPUT, "feature_output_hook",
                                          cfg_path))
    except InvalidInputError as exc:
        raise InvalidInputError(f"{cfg_path}: {exc}") from exc
    clt = build_clt(cfg)
    state = {"W_enc": torch.stack(W_enc), "b_enc": torch.stack(b_enc), "b_dec": torch.stack(b_dec),
             "log_threshold": thresholds.log(), **{f"W_dec.{i}": w for i, w in enumerate(W_dec)}}
    clt.load_state_dict(state)
    return clt.to(W_enc[0].dtype).eval()
