"""JumpReLU SAE (Rajamanoharan et al. 2024, "Jumping Ahead: Improving Reconstruction
Fidelity with JumpReLU Sparse Autoencoders").

`f = pre * H(pre - threshold)` with a per-latent threshold trained as `log_threshold`.
The loss is `E||x - x_hat||^2 + l0_coefficient * E_t ||f_t||_0`. The Heaviside step has
no useful gradient, so both the JumpReLU and the L0 term use straight-through estimators
for the threshold with a rectangle kernel of width `jumprelu_bandwidth` (epsilon):
`d/dθ JumpReLU(z) = -(θ/ε) K((z-θ)/ε)` and `d/dθ H(z-θ) = -(1/ε) K((z-θ)/ε)`,
`K(u) = 1[|u| < 1/2]`; the pre-activations get the ordinary gradient `H(z-θ)` through
the JumpReLU and none through the L0 term.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.sae.losses import StepInfo, TrainStep, fired_counts, step_metrics


def _rectangle(u: torch.Tensor) -> torch.Tensor:
    return (u.abs() < 0.5).to(u.dtype)


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pre, log_threshold, bandwidth):  # type: ignore[override]
        threshold = log_threshold.exp()
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_pre = grad * (pre > threshold)
        grad_theta = -(threshold / eps) * _rectangle((pre - threshold) / eps) * grad
        grad_log = (grad_theta.reshape(-1, pre.shape[-1]).sum(0)) * threshold
        return grad_pre, grad_log, None


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pre, log_threshold, bandwidth):  # type: ignore[override]
        threshold = log_threshold.exp()
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_theta = -(1.0 / eps) * _rectangle((pre - threshold) / eps) * grad
        grad_log = grad_theta.reshape(-1, pre.shape[-1]).sum(0) * threshold
        return None, grad_log, None


def jumprelu_ste(pre: torch.Tensor, log_threshold: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """`pre * H(pre - exp(log_threshold))` with the straight-through threshold gradient
    (`log_threshold [F]` against the last dimension of `pre [..., F]`)."""
    return _JumpReLU.apply(pre, log_threshold, bandwidth)


def step_ste(pre: torch.Tensor, log_threshold: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """`H(pre - exp(log_threshold))` (what the L0 penalty counts) with the straight-through
    threshold gradient and none for `pre`."""
    return _Step.apply(pre, log_threshold, bandwidth)


class JumpReLUSAE(SAE):
    """SAE with a learned per-latent threshold, trained with an L0 penalty."""

    architecture = "jumprelu"
    saelens_architecture = "jumprelu"
    has_threshold = True

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__(cfg)
        self.log_threshold = nn.Parameter(
            torch.full((cfg.d_sae,), math.log(cfg.jumprelu_init_threshold))
        )

    @property
    def threshold(self) -> torch.Tensor:
        """Per-latent thresholds `exp(log_threshold)` `[d_sae]`."""
        return self.log_threshold.exp()

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return pre * (pre > self.threshold)

    @torch.no_grad()
    def divide_thresholds(self, divisor: float) -> None:
        self.log_threshold.sub_(math.log(divisor))

    def training_loss(self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None) -> TrainStep:
        """Reconstruction (of `target` when given) + L0 loss with straight-through threshold gradients."""
        pre = self.encode_pre(x)
        eps = self.cfg.jumprelu_bandwidth
        f = jumprelu_ste(pre, self.log_threshold, eps)
        x_hat = self.with_skip(self.decode(f), x)
        metrics = step_metrics(x if target is None else target, x_hat, (f != 0).sum(-1), info)
        l0 = step_ste(pre, self.log_threshold, eps).sum(-1).mean()
        loss = metrics["mse"] + self.cfg.l0_coefficient * l0
        return TrainStep(loss, {k: v.detach() for k, v in metrics.items()}, fired_counts(f))
