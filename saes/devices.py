"""The one place that turns a user's `--device` / `--dtype` into torch objects.

Devices: `cpu`, `cuda`, `cuda:N`, `mps`, or `auto` (CUDA when present, else MPS, else
CPU). Asking for an accelerator that is not there is an `InvalidInputError` that says
what is available, never a silent fall back to the CPU. Model dtypes: `float32`,
`float16`, `bfloat16`, or `auto` (bfloat16 on CUDA, float32 elsewhere).

Processes that load a model without being handed a device (the HTTP workers of
`sae-atlas serve`, `Atlas` in a notebook) read the defaults from the environment
variables `SAE_ATLAS_DEVICE` and `SAE_ATLAS_DTYPE` (unset: `cpu`, `float32`), which the
CLI sets from its options.
"""

from __future__ import annotations

import os
import re
from typing import Literal

import torch

from sae_atlas.errors import InvalidInputError

DeviceName = Literal["auto", "cpu", "cuda", "mps"]  # plus "cuda:N"
ModelDtype = Literal["auto", "float32", "float16", "bfloat16"]
ENV_DEVICE = "SAE_ATLAS_DEVICE"
ENV_DTYPE = "SAE_ATLAS_DTYPE"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def available_devices() -> list[str]:
    """The devices this process can use, e.g. ['cpu', 'cuda:0', 'cuda:1']."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        found.append("mps")
    return found


def resolve_device(name: str | torch.device | None = None) -> torch.device:
    """The torch device for `name` (None: `$SAE_ATLAS_DEVICE`, else cpu); InvalidInputError
    for an unknown name or an accelerator this machine does not have."""
    if isinstance(name, torch.device):
        name = str(name)
    text = (name or os.environ.get(ENV_DEVICE) or "cpu").strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "mps":
        if not _mps_available():
            raise InvalidInputError(f"device 'mps' is not available here; available: {available_devices()}")
        return torch.device("mps")
    match = _CUDA.match(text)
    if match is None:
        raise InvalidInputError(f"unknown device {name!r}; valid: auto, cpu, cuda, cuda:N, mps")
    if not torch.cuda.is_available():
        raise InvalidInputError(
            f"device {text!r} asked for, but this machine has no CUDA GPU visible to torch "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
            f"available: {available_devices()}; use --device cpu or auto"
        )
    index = int(match.group(1)) if match.group(1) is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise InvalidInputError(f"device {text!r} does not exist; available: {available_devices()}")
    return torch.device("cuda", index)


def resolve_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The model dtype for `name` (None: `$SAE_ATLAS_DTYPE`, else float32) on `device`."""
    if isinstance(name, torch.dtype):
        return name
    text = (name or os.environ.get(ENV_DTYPE) or "float32").strip().lower()
    if text == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if text not in _DTYPES:
        raise InvalidInputError(f"unknown model dtype {name!r}; valid: auto, {', '.join(_DTYPES)}")
    return _DTYPES[text]


def use_by_default(device: str | None, dtype: str | None) -> torch.device:
    """Check `device` / `dtype` and make them this process's (and its children's) defaults
    through `$SAE_ATLAS_DEVICE` / `$SAE_ATLAS_DTYPE`; return the resolved device."""
    resolved = resolve_device(device)
    resolve_dtype(dtype, resolved)
    os.environ[ENV_DEVICE] = str(resolved)
    if dtype:
        os.environ[ENV_DTYPE] = dtype
    return resolved

