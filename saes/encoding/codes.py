"""The SAE codes of activations captured from the model, computed on the SAE's device."""

from __future__ import annotations

import torch

from sae_atlas.saes.sae.base import SAE


def sae_codes(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """Feature activations `[..., d_sae]` of the activations `x` `[..., d_in]` (cast to
    float32 and moved to the SAE's device), on the SAE's device."""
    return sae.encode(x.float().to(sae.W_enc.device))
