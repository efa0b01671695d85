"""Floating-point dtype names the atlas stores (activations, SAE weights) and their torch dtypes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, cast

import torch

from sae_atlas.errors import InvalidInputError

DTypeName = Literal["float32", "float16", "bfloat16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_name(value: object, where: str | Path | None = None, *, kind: str = "dtype") -> DTypeName:
    """The canonical name ('float32', ...) of `value` ('float32', 'torch.float32' or a
    torch dtype); InvalidInputError naming `where` (a file) and the valid names otherwise."""
    name = str(value).removeprefix("torch.")
    if name not in DTYPES:
        prefix = f"{where}: " if where is not None else ""
        raise InvalidInputError(f"{prefix}unknown {kind} {value!r}; valid: {', '.join(DTYPES)}")
    return cast(DTypeName, name)


def parse_dtype(value: object, where: str | Path | None = None, *, kind: str = "dtype") -> torch.dtype:
    """The torch dtype for a dtype name (see `dtype_name`)."""
    return DTYPES[dtype_name(value, where, kind=kind)]
