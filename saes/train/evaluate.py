"""Held-out metrics of a trained SAE, computed at the end of training.

The metrics are `saes.eval.reconstruction.ReconstructionStats`' (SAEBench names, the
correct explained-variance denominator `sum_d Var(x_d)`), over raw activation batches with
the SAE in eval mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from saes.eval.reconstruction import ReconstructionStats
from saes.sae.base import SAE


@torch.no_grad()
def evaluate_sae(sae: SAE, batches: Iterable[torch.Tensor]) -> tuple[dict[str, Any], torch.Tensor]:
    """Metrics of `sae` over `batches`, and the per-latent density `[d_sae]`
    (`{"n_tokens": 0}` and zeros when the batches are empty)."""
    stats = ReconstructionStats(sae.cfg.d_in, sae.cfg.d_sae)
    device = sae.W_enc.device
    was_training = sae.training
    sae.eval()
    try:
        for batch in batches:
            x = batch.to(device, torch.float32)
            out = sae(x)
            stats.update(x, out.x_hat, out.feature_acts)
    finally:
        sae.train(was_training)
    if stats.n == 0:
        return {"n_tokens": 0}, torch.zeros(sae.cfg.d_sae)
    return stats.result(), stats.density()
