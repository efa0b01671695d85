"""TransformerLens forward-hook functions: capture an activation, or replace it.

A hook function takes `(activation, hook)` and returns the activation the model continues
with. `capture_hook` reads it and passes it on unchanged; `replace_hook` returns a new one
(in the activation's dtype). Caching, concept prompts, the spliced-model metrics and the
patching experiments all build their hooks from these two.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

HookFn = Callable[[torch.Tensor, Any], torch.Tensor]


def capture_hook(sink: Callable[[torch.Tensor], object]) -> HookFn:
    """A hook fn that hands the activation to `sink` and leaves it unchanged."""

    def capture(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
        sink(act)
        return act

    return capture


def capture_hooks(hooks: Sequence[str], store: dict[str, torch.Tensor]) -> list[tuple[str, HookFn]]:
    """`(hook, fn)` pairs that store each hook's activation (detached) in `store[hook]`."""

    def into(name: str) -> HookFn:
        return capture_hook(lambda act: store.__setitem__(name, act.detach()))

    return [(name, into(name)) for name in hooks]


def replace_hook(replace: Callable[[torch.Tensor], torch.Tensor]) -> HookFn:
    """A hook fn that returns `replace(act)`, cast to the activation's dtype."""

    def swap(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
        return replace(act).to(act.dtype)

    return swap
