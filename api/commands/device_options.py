"""The `--device` and `--model-dtype` options shared by every command that runs a model or an SAE."""

from __future__ import annotations

from typing import Any

import typer

from saes.devices import DEVICE_HELP, DTYPE_HELP


def device_option(default: str | None = "auto", default_note: str = "") -> Any:
    """A `--device` option (resolved by `saes.devices.resolve_device`); `default_note` says
    in the help what an unset (None) default stands for."""
    return typer.Option(default, "--device", help=f"{DEVICE_HELP} {default_note}".strip())


def model_dtype_option() -> Any:
    """A `--model-dtype` option (resolved by `saes.devices.resolve_dtype`)."""
    return typer.Option("float32", "--model-dtype", help=DTYPE_HELP)
