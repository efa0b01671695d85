"""One capturing forward pass: the activations of several hooks from a single run of the
model, stopped after the deepest hooked layer."""

from __future__ import annotations

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.hook_fns import capture_hooks
from sae_atlas.saes.models import ModelHandle


def run_hooks(handle: ModelHandle, tokens: torch.Tensor, hooks: list[str]) -> dict[str, torch.Tensor]:
    """Activations `[batch, pos, d]` of `hooks` from one forward pass stopped after the deepest
    (on the model's device; `tokens` are moved there)."""
    stop = max(handle.hook_layer(h) for h in hooks) + 1
    captured: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        handle.bridge.run_with_hooks(
            tokens.to(handle.device), fwd_hooks=capture_hooks(hooks, captured), stop_at_layer=max(stop, 1)
        )
    missing = [h for h in hooks if h not in captured]
    if missing:
        raise InvalidInputError(f"hooks {missing} did not fire before layer {stop}")
    return captured
