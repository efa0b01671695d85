"""TransformerLens forward-hook functions: capture an activation, or replace it.

A hook function takes `(activation, hook)` and returns the activation the model continues
with. `capture_hook` reads it and passes it on unchanged; `replace_hook` returns a new one
(in the activation's dtype). Caching, concept prompts, the spliced-model metrics and the
patching experiments all build their hooks from these two. `in_residual` makes an edit
of `blocks.L.hook_resid_mid` reach the residual stream (see `residual_carry`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
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


_RESID_MID = re.compile(r"^blocks\.(\d+)\.hook_resid_mid$")


def residual_carry(hook_dict: Mapping[str, Any], name: str) -> str | None:
    """Where a change made at `name` must also enter the residual stream, or None.

    TransformerBridge fires `blocks.L.hook_resid_mid` of a decoder block as the input of
    the MLP's norm (`blocks.L.ln2.hook_in`, the same HookPoint): what a hook returns there
    reaches the MLP, while the block adds the MLP's output to the unhooked residual. For
    such a hook this returns `blocks.L.hook_resid_post`, where the change is added again so
    that an edit of `hook_resid_mid` edits the residual stream, as its name says. A block
    with a hook of its own in the residual (e.g. T5's) needs no carry."""
    match = _RESID_MID.match(name)
    if match is None:
        return None
    point, norm_in = hook_dict.get(name), hook_dict.get(f"blocks.{match[1]}.ln2.hook_in")
    post = f"blocks.{match[1]}.hook_resid_post"
    return post if point is not None and point is norm_in and post in hook_dict else None


def in_residual(bridge: Any, fwd_hooks: Sequence[tuple[str, HookFn]]) -> list[tuple[str, HookFn]]:
    """`fwd_hooks` for `bridge.run_with_hooks` / `bridge.hooks` with every change made at a
    norm-input `hook_resid_mid` (`residual_carry`) also added to the block's output, so
    the edit reaches later layers; other hooks pass through unchanged."""
    out: list[tuple[str, HookFn]] = []
    for name, fn in fwd_hooks:
        carry = residual_carry(bridge.hook_dict, name)
        if carry is None:
            out.append((name, fn))
            continue
        delta: dict[str, torch.Tensor] = {}

        def edit(act: torch.Tensor, hook: Any = None, fn: HookFn = fn, delta: dict = delta) -> torch.Tensor:
            before = act.clone()  # `fn` may edit in place
            new = fn(act, hook)
            delta["change"] = new - before
            return new

        def add(act: torch.Tensor, hook: Any = None, delta: dict = delta) -> torch.Tensor:
            change = delta.pop("change", None)
            return act if change is None else (act + change).to(act.dtype)

        out += [(name, edit), (carry, add)]
    return out
