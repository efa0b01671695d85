"""The one way to encode activations with a dictionary: cast them to its weights' dtype and
device, then `encode`. Every caller goes through `sae_codes`."""

from __future__ import annotations

from typing import Protocol

import torch


class Encoder(Protocol):
    """What `sae_codes` encodes with: an SAE, or one layer of a cross-layer transcoder."""

    @property
    def W_enc(self) -> torch.Tensor: ...

    def encode(self, x: torch.Tensor) -> torch.Tensor: ...


def sae_codes(sae: Encoder, x: torch.Tensor) -> torch.Tensor:
    """Feature activations `[..., d_sae]` of the activations `x` `[..., d_in]`, cast to the
    encoder's dtype and moved to its device; the codes stay there, in that dtype. The
    autograd graph is kept: callers that need none run under `torch.no_grad()`."""
    W = sae.W_enc
    return sae.encode(x.to(device=W.device, dtype=W.dtype))
