"""Held-out metrics of a trained SAE, computed at the end of training.

FVU uses the correct denominator: `E_t||x - x_hat||^2 / sum_d Var(x_d)`, with the
variance taken over all evaluated tokens (not `E||x||^2`). Also L0, per-latent density
and the fractions of dead (never firing) and dense (> 10% of tokens) latents.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from saes.sae.base import SAE


@torch.no_grad()
def evaluate_sae(sae: SAE, batches: Iterable[torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
    """Metrics of `sae` (eval mode) over raw activation batches, and density `[d_sae]`."""
    device = sae.W_enc.device
    n = 0
    sse = 0.0
    l0 = 0.0
    cos = 0.0
    sum_x = torch.zeros(sae.cfg.d_in, dtype=torch.float64, device=device)
    sum_x2 = torch.zeros_like(sum_x)
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.float64, device=device)
    was_training = sae.training
    sae.eval()
    for batch in batches:
        x = batch.to(device, torch.float32)
        out = sae(x)
        active = out.feature_acts != 0
        sse += float((x - out.x_hat).double().pow(2).sum())
        l0 += float(active.sum())
        cos += float(torch.nn.functional.cosine_similarity(x, out.x_hat, dim=-1).double().sum())
        sum_x += x.double().sum(0)
        sum_x2 += x.double().pow(2).sum(0)
        fired += active.sum(0).double()
        n += x.shape[0]
    sae.train(was_training)
    if n == 0:
        return {"n_tokens": 0}, torch.zeros(sae.cfg.d_sae)
    variance = float((sum_x2 / n - (sum_x / n).pow(2)).sum())
    density = (fired / n).float().cpu()
    fvu = sse / n / max(variance, 1e-12)
    metrics = {
        "n_tokens": n,
        "fvu": fvu,
        "explained_variance": 1.0 - fvu,
        "l0": l0 / n,
        "cossim": cos / n,
        "dead_fraction": float((density == 0).float().mean()),
        "dense_fraction": float((density > 0.1).float().mean()),
    }
    return metrics, density
