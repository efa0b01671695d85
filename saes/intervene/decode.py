"""Incremental decoding of a spliced model with a KV cache, for a batch of prompts.

The prompts are left-padded to one width (the padding is masked out of attention and the
model's position ids skip it). `prefill` runs the whole padded prompt once; each `step`
runs the model on the one new column only, the keys and values of earlier positions
coming from a Hugging Face `DynamicCache`. The splice's hooks are told every token's
absolute position in its own prompt (`HookPositions`: -1 on padding), so each edit acts at
exactly the positions it would in a full forward pass of that row's unpadded sequence.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.hook_fns import in_residual
from sae_atlas.saes.intervene.splice import HookPositions, Splice
from sae_atlas.saes.models import ModelHandle

PAD_ID = 0  # any valid token id: padding is masked out of attention and never edited


def cache_arguments(model: Any, cache: Any) -> dict[str, Any]:
    """Forward keywords that hand `cache` to the Hugging Face `model` and to the bridge's
    attention layers. transformers >= 5.25 names it `cache` (before: `past_key_values`) and
    passes it to attention layers under that name, while the bridge's attention reads
    `past_key_values` or `layer_past`: so it also goes as `layer_past` (the bridge updates
    the one object it finds, once per layer)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache, "layer_past": cache, "use_cache": True}


class CachedDecoder:
    """Next-token logits of a batch of prompts, one new column at a time (see the module
    docstring). Made by `cached_decoding`, which installs the splice's hooks."""

    def __init__(self, handle: ModelHandle, prompts: Sequence[torch.Tensor], positions: HookPositions) -> None:
        from transformers import DynamicCache

        lengths = torch.tensor([len(p) for p in prompts])
        if len(prompts) == 0 or int(lengths.min()) == 0:
            raise InvalidInputError("need at least one prompt, each of at least one token")
        self.handle = handle
        self.positions = positions
        self.width = int(lengths.max())
        self.pad_B = self.width - lengths
        self.prompt_BT = torch.stack(
            [torch.cat([torch.full((int(pad),), PAD_ID, dtype=p.dtype), p.cpu()]) for p, pad in zip(prompts, self.pad_B, strict=True)]
        )
        padded = bool(self.pad_B.any())
        self.attention_mask_BT = (torch.arange(self.width) >= self.pad_B[:, None]).long() if padded else None
        model = handle.bridge.original_model
        self.cache = DynamicCache(config=model.config)
        self.cache_kwargs = cache_arguments(model, self.cache)

    def prefill(self) -> torch.Tensor:
        """Next-token logits `[B, V]` after each whole prompt; fills the cache."""
        logits_BV = self._forward(self.prompt_BT, torch.arange(self.width) - self.pad_B[:, None])
        if self.cache.get_seq_length() != self.width:
            raise RuntimeError(
                f"the model bridge did not fill the KV cache ({self.cache.get_seq_length()} of {self.width} "
                "positions): this TransformerLens / transformers pair does not support cached decoding")
        return logits_BV

    def step(self, next_B: torch.Tensor) -> torch.Tensor:
        """Feed one new token per row (`[B]`) and return the next-token logits `[B, V]`."""
        position_B1 = (self.width - self.pad_B)[:, None]
        self.width += 1
        if self.attention_mask_BT is not None:
            ones = torch.ones(len(next_B), 1, dtype=self.attention_mask_BT.dtype)
            self.attention_mask_BT = torch.cat([self.attention_mask_BT, ones], 1)
        return self._forward(next_B.reshape(-1, 1), position_B1)

    def _forward(self, ids_BT: torch.Tensor, positions_BT: torch.Tensor) -> torch.Tensor:
        self.positions.current = positions_BT
        device = self.handle.device
        mask = None if self.attention_mask_BT is None else self.attention_mask_BT.to(device)
        logits = self.handle.bridge.forward(ids_BT.to(device), attention_mask=mask, **self.cache_kwargs)
        return logits[:, -1].float()


@contextmanager
def cached_decoding(handle: ModelHandle, prompts: Sequence[torch.Tensor], splice: Splice) -> Iterator[CachedDecoder]:
    """A `CachedDecoder` over `prompts` with `splice` hooked in (inference mode) for the
    duration of the block; `splice` acts on every row (see `stack_splices` for per-row
    edits)."""
    for h in splice.hooks:
        handle.check_hook(h)
    positions = HookPositions()
    with torch.inference_mode(), handle.bridge.hooks(
            fwd_hooks=in_residual(handle.bridge, splice.fwd_hooks(positions=positions))):
        yield CachedDecoder(handle, prompts, positions)
