"""BatchTopK SAE (Bussmann et al. 2024, "BatchTopK Sparse Autoencoders").

Training keeps the `k * batch` largest of `relu(pre)` over the whole batch, so the
number of active latents varies per token and averages k. Inference cannot see the
batch, so it uses a JumpReLU with one learned threshold for all latents: the smallest
value kept by the batch top-k. That threshold is set from the first batch and then
tracked with a running mean whose rate decays as `1/(step+1)` down to a floor scaled to
the run length (at least 10 time constants fit in the run), so it has converged to the
final model's value by the end of training instead of creeping up from 0.
"""

from __future__ import annotations

import torch

from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.sae.losses import (
    StepInfo,
    TrainStep,
    auxk_loss,
    auxk_select,
    fired_counts,
    step_metrics,
)


def batch_topk_code(pre_BF: torch.Tensor, k: int) -> torch.Tensor:
    """Dense code keeping the `k * B` largest entries of `relu(pre)` over the batch."""
    acts = pre_BF.relu()
    flat = acts.reshape(-1)
    n_keep = min(k * pre_BF.shape[0], flat.numel())
    top = flat.topk(n_keep, sorted=False)
    return torch.zeros_like(flat).scatter_(0, top.indices, top.values).reshape(acts.shape)


def threshold_rate(step: int, total_steps: int) -> float:
    """Running-mean rate of the inference threshold at `step`: `max(1/(step+1), floor)`."""
    floor = min(0.1, max(1e-3, 10.0 / max(1, total_steps)))
    return max(1.0 / (step + 1), floor)


class BatchTopKSAE(SAE):
    """SAE trained with batch top-k; inference is a JumpReLU at the learned `threshold`."""

    architecture = "batchtopk"
    needs_k = True
    saelens_architecture = "jumprelu"
    has_threshold = True
    k_is_mean_l0 = True

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("threshold", torch.zeros(cfg.d_sae))

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        if self.training:
            return batch_topk_code(pre.reshape(-1, pre.shape[-1]), self.cfg.k).reshape(pre.shape)
        acts = pre.relu()
        return acts * (acts > self.threshold)

    @torch.no_grad()
    def divide_thresholds(self, divisor: float) -> None:
        self.threshold.div_(divisor)

    @torch.no_grad()
    def _update_threshold(self, f_BF: torch.Tensor, info: StepInfo) -> None:
        kept = f_BF[f_BF > 0]
        if kept.numel() == 0:
            return
        rate = threshold_rate(info.step, info.total_steps)
        self.threshold.mul_(1.0 - rate).add_(rate * kept.min())

    def _reconstruction_loss(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        x_hat: torch.Tensor,
        f: torch.Tensor,
        info: StepInfo,
        metrics: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        return metrics["fvu"]

    def training_loss(self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None) -> TrainStep:
        """FVU (+ AuxK) loss with the batch top-k code (predicting `target` when given);
        updates the inference threshold."""
        pre = self.encode_pre(x)
        f = batch_topk_code(pre, self.cfg.k)
        self._update_threshold(f, info)
        x_hat = self.with_skip(self.decode(f), x)
        y = x if target is None else target
        metrics = step_metrics(y, x_hat, (f > 0).sum(-1), info)
        loss = self._reconstruction_loss(x, y, x_hat, f, info, metrics)
        if info.dead_mask is not None:
            aux = auxk_select(pre, info.dead_mask, info.k_aux)
            if aux is not None:
                metrics["auxk"] = auxk_loss(y - x_hat, aux[0], aux[1], self.W_dec)
                loss = loss + info.aux_coefficient * metrics["auxk"]
        metrics["threshold"] = self.threshold[0].clone()
        return TrainStep(loss, {k: v.detach() for k, v in metrics.items()}, fired_counts(f))
