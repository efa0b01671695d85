"""Learning-rate schedule: linear warm-up, constant, linear decay to 0 at the end."""

from __future__ import annotations

import torch


def lr_factor(step: int, total_steps: int, warmup_steps: int, decay_fraction: float) -> float:
    """Multiplier of the base learning rate at optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = int(round(total_steps * decay_fraction))
    decay_start = total_steps - decay_steps
    if decay_steps > 0 and step >= decay_start:
        return max(0.0, (total_steps - step) / decay_steps)
    return 1.0


def make_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, decay_fraction: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR applying `lr_factor` (its state is checkpointed with the run)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup_steps, decay_fraction)
    )
