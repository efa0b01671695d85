"""Paired activation rows for transcoders: the hook a transcoder reads and the hook it
writes, at the same tokens, side by side.

A transcoder trains and evaluates on rows `[n, d_in + d_out]`: the input hook's
activation followed by the output hook's activation of the same token. Two caches made
in one `sae-atlas cache` run hold the same blocks in the same shards, so their seeded
shuffled batches (`ActivationReader.batches`) visit the tokens in the same order;
`PairedReader` checks that the caches do hold the same tokens before it pairs them.
An SAE's rows are its input alone (`row_width` is d_in, the target is the input).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.activations import ActivationReader, Blocks, Split, TokenRows
from sae_atlas.store.safetensors_io import MappedSafetensors


def row_width(cfg: SAEConfig) -> int:
    """Width of one training row: `d_in + d_out` for a transcoder, `d_in` for an SAE."""
    return cfg.d_in + cfg.output_dim if cfg.is_transcoder else cfg.d_in


def input_and_target(cfg: SAEConfig, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(x [n, d_in], target [n, d_out])` of rows: split for a transcoder, `(rows, rows)` for an SAE."""
    if rows.shape[-1] != row_width(cfg):
        what = "d_in + d_out" if cfg.is_transcoder else "d_in"
        raise InvalidInputError(f"expected rows of width {what} = {row_width(cfg)}, got shape {tuple(rows.shape)}")
    if not cfg.is_transcoder:
        return rows, rows
    return rows[..., : cfg.d_in], rows[..., cfg.d_in :]


def _token_ids(reader: ActivationReader) -> list[np.ndarray]:
    return [np.asarray(MappedSafetensors(reader.dir / shard["file"], reader.repair).numpy("token_ids"))
            for shard in reader.manifest["shards"]]


def check_same_tokens(readers: list[ActivationReader], purpose: str) -> None:
    """InvalidInputError unless every cache holds the same tokens in the same shards (one
    `sae-atlas cache` run); `purpose` ends the message ("train a transcoder between them")."""
    first = readers[0]
    ids = _token_ids(first)
    for other in readers[1:]:
        layouts = [[(s["first_block"], s["n_blocks"]) for s in r.manifest["shards"]] for r in (first, other)]
        same = (first.model == other.model and first.context_size == other.context_size and layouts[0] == layouts[1]
                and all(np.array_equal(a, b) for a, b in zip(ids, _token_ids(other), strict=True)))
        if not same:
            raise InvalidInputError(
                f"the caches of {first.hook!r} and {other.hook!r} do not hold the same tokens in the same shards; "
                f"cache the hooks in one `sae-atlas cache` run to {purpose}")


class PairedReader:
    """Two hooks' caches read as paired rows `[n, d_in + d_out]` (input hook first).

    InvalidInputError when the caches do not hold the same tokens in the same shards
    (different runs, models or amounts): cache both hooks in one `sae-atlas cache` run.
    """

    def __init__(self, root: str | Path, hook_in: str, hook_out: str) -> None:
        self.input = ActivationReader(root, hook_in)
        self.output = ActivationReader(root, hook_out)
        check_same_tokens([self.input, self.output], "train a transcoder between them")

    hook = property(lambda self: self.input.hook)
    hook_out = property(lambda self: self.output.hook)
    model = property(lambda self: self.input.model)
    d = property(lambda self: self.input.d)
    d_out = property(lambda self: self.output.d)
    context_size = property(lambda self: self.input.context_size)
    manifest = property(lambda self: self.input.manifest)
    dir = property(lambda self: self.input.dir)  # the input cache (its manifest dates an evaluation)

    def count_tokens(self, split: Split = "all", exclude_bos: bool = True) -> int:
        """Token rows one pass over a split gives (the same for both hooks)."""
        return self.input.count_tokens(split, exclude_bos)

    def blocks(self, split: Split = "all") -> Iterator[Blocks]:
        """Whole blocks of a split in order, activations paired `[n, T, d_in + d_out]`."""
        for x, y in zip(self.input.blocks(split), self.output.blocks(split), strict=True):
            yield dataclasses.replace(x, acts=torch.cat([x.acts, y.acts], dim=-1))

    def rows(self, split: Split = "all", **options: Any) -> Iterator[TokenRows]:
        """Token rows of a split in cache order, paired; options as `ActivationReader.rows`'."""
        for x, y in zip(self.input.rows(split, **options), self.output.rows(split, **options), strict=True):
            yield TokenRows(torch.cat([x.acts, y.acts], dim=-1), x.token_ids, x.positions)

    def batches(self, batch_size: int, **options: Any) -> Iterator[torch.Tensor]:
        """Seeded shuffled paired batches `[batch_size, d_in + d_out]`; the options are
        `ActivationReader.batches`' and apply to both hooks, which therefore draw the same tokens."""
        pairs = zip(self.input.batches(batch_size, **options), self.output.batches(batch_size, **options), strict=True)
        for x, y in pairs:
            yield torch.cat([x, y], dim=-1)
