"""Standard SAE: ReLU code, L1 penalty weighted by decoder row norms, L1 warm-up.

Loss (Anthropic, "Towards Monosemanticity" and its April 2024 update):
`E_t||x - x_hat||^2 + l1 * E_t sum_i f_i ||W_dec_i||`, with the L1 coefficient ramped
linearly from 0 over `l1_warmup_steps`.
"""

from __future__ import annotations

import torch

from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.sae.losses import StepInfo, TrainStep, fired_counts, step_metrics


class StandardSAE(SAE):
    """ReLU SAE trained with a decoder-norm-weighted L1 penalty."""

    architecture = "standard"
    saelens_architecture = "standard"

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return pre.relu()

    def training_loss(self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None) -> TrainStep:
        """Reconstruction + warmed-up L1 loss on a batch `x [B, d_in]` (of `target` when given)."""
        pre = self.encode_pre(x)
        f = pre.relu()
        x_hat = self.with_skip(self.decode(f), x)
        metrics = step_metrics(x if target is None else target, x_hat, (f > 0).sum(-1), info)
        l1 = (f * self.W_dec.norm(dim=-1)).sum(-1).mean()
        warm = min(1.0, (info.step + 1) / max(1, self.cfg.l1_warmup_steps))
        loss = metrics["mse"] + self.cfg.l1_coefficient * warm * l1
        metrics["l1"] = l1
        return TrainStep(loss, {k: v.detach() for k, v in metrics.items()}, fired_counts(f))
