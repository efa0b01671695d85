"""The `--device` and `--model-dtype` options shared by every command that runs a model or an SAE
(resolved by `saes.devices`, which these options leave unimported until a command runs)."""

from __future__ import annotations

from typing import Any

import typer

DEVICE_HELP = "Device that runs the model and SAEs: auto (GPU when present), cpu, cuda, cuda:N or mps."
DTYPE_HELP = "Model weight dtype: auto (bfloat16 on CUDA, float32 elsewhere), float32, float16 or bfloat16."


def device_option(default: str | None = "auto", default_note: str = "") -> Any:
    """A `--device` option (resolved by `saes.devices.resolve_device`); `default_note` says
    in the help what an unset (None) default stands for."""
    return typer.Option(default, "--device", help=f"{DEVICE_HELP} {default_note}".strip())


def model_dtype_option() -> Any:
    """A `--model-dtype` option (resolved by `saes.devices.resolve_dtype`)."""
    return typer.Option("float32", "--model-dtype", help=DTYPE_HELP)
