"""Safetensors files: deterministic writing, and memory-mapped reading (bfloat16 included).

The official writer orders its header through a hash map, so two writes of the same
tensors can differ in their bytes; `save_deterministic` always writes the same bytes for
the same tensors and metadata, which makes shard checksums reproducible.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

from sae_atlas.errors import IntegrityError

_NUMPY_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # reinterpreted as torch.bfloat16 on access
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


_TORCH_CODES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def save_deterministic(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str]) -> None:
    """Write `tensors` (in sorted name order) as a standard safetensors file at `path`."""
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        raw = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {
            "dtype": _TORCH_CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for raw in blobs:
            handle.write(raw)


class MappedSafetensors:
    """Tensors of one safetensors file as read-only numpy memmaps (lazily paged in)."""

    def __init__(self, path: str | Path, repair: str) -> None:
        self.path = Path(path)
        self.repair = repair
        try:
            size = self.path.stat().st_size
        except FileNotFoundError as exc:
            raise IntegrityError(self.path, "file is missing", repair) from exc
        with open(self.path, "rb") as handle:
            raw_len = handle.read(8)
            if len(raw_len) < 8:
                raise IntegrityError(self.path, "file is truncated (no safetensors header)", repair)
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > size - 8:
                raise IntegrityError(self.path, "file is truncated (header runs past the end)", repair)
            try:
                header = json.loads(handle.read(header_len))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise IntegrityError(self.path, "safetensors header is not valid JSON", repair) from exc
        self.metadata: dict[str, str] = header.pop("__metadata__", {}) or {}
        self._entries = header
        self._data_start = 8 + header_len
        data_len = max((e["data_offsets"][1] for e in header.values()), default=0)
        if self._data_start + data_len > size:
            raise IntegrityError(
                self.path,
                f"file is truncated ({size} bytes, header describes {self._data_start + data_len})",
                repair,
            )

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def numpy(self, name: str) -> np.ndarray:
        """The tensor as a read-only memmap (bfloat16 appears as uint16)."""
        if name not in self._entries:
            raise IntegrityError(self.path, f"tensor {name!r} is missing", self.repair)
        entry = self._entries[name]
        dtype = _NUMPY_DTYPES[entry["dtype"]]
        start, end = entry["data_offsets"]
        count = (end - start) // np.dtype(dtype).itemsize
        if count == 0:
            return np.zeros(entry["shape"], dtype=dtype)
        flat = np.memmap(self.path, dtype=dtype, mode="r", offset=self._data_start + start, shape=(count,))
        return flat.reshape(entry["shape"])

    def torch(self, name: str, index: np.ndarray | slice | None = None) -> torch.Tensor:
        """The tensor (or rows `index` of it) copied into memory as a torch tensor."""
        array = self.numpy(name)
        selected = np.array(array if index is None else array[index], copy=True, order="C")
        tensor = torch.from_numpy(selected)
        if self._entries[name]["dtype"] == "BF16":
            tensor = tensor.view(torch.int16).view(torch.bfloat16)
        return tensor
