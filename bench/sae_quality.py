"""Held-out quality of a trained SAE from its encode/decode: FVU, L0, dead fraction.

Only needs torch, so `bench/train_quality.py` and its SAELens driver (which runs in a
throwaway venv) measure both trainers with the same code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


@torch.no_grad()
def heldout_metrics(encode: Callable[[torch.Tensor], torch.Tensor], decode: Callable[[torch.Tensor], torch.Tensor],
                    x_ND: torch.Tensor, batch: int = 4096) -> dict[str, float]:
    """FVU (residual energy over variance about the held-out mean), mean L0, and the
    fraction of latents that never fire on `x_ND`."""
    mean_D = x_ND.mean(0)
    residual = variance = l0 = 0.0
    fired_F = None
    for start in range(0, len(x_ND), batch):
        x = x_ND[start:start + batch]
        acts_BF = encode(x)
        residual += float((decode(acts_BF) - x).pow(2).sum())
        variance += float((x - mean_D).pow(2).sum())
        active = acts_BF != 0
        l0 += float(active.sum())
        fired_F = active.any(0) if fired_F is None else fired_F | active.any(0)
    return {"fvu": residual / variance, "l0": l0 / len(x_ND), "dead_fraction": 1.0 - float(fired_F.float().mean())}
