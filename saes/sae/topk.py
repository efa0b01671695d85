"""TopK SAE (Gao et al. 2024, "Scaling and evaluating sparse autoencoders").

The code keeps the k largest of `relu(pre)` per token (at most k non-zeros). The training
loss is FVU plus AuxK on dead latents; by default it runs on the sparse fast path
(`saes.sae.fast_topk`), which never forms a dense `[batch, d_sae]` decode or gradient.
"""

from __future__ import annotations

import torch

from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.sae.fast_topk import topk_sparse_forward
from sae_atlas.saes.sae.losses import (
    StepInfo,
    TrainStep,
    auxk_loss,
    auxk_select,
    step_metrics,
)


def topk_code(pre: torch.Tensor, k: int) -> torch.Tensor:
    """Dense code keeping the k largest of `relu(pre)` along the last dimension."""
    top = pre.topk(k, dim=-1, sorted=False)
    return torch.zeros_like(pre).scatter_(-1, top.indices, top.values.relu())


class TopKSAE(SAE):
    """SAE whose code is the per-token top-k of the ReLU pre-activations."""

    architecture = "topk"
    needs_k = True
    saelens_architecture = "topk"

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return topk_code(pre, self.cfg.k)

    def training_loss(
        self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None, *, fast: bool = True
    ) -> TrainStep:
        """FVU + AuxK loss on `x [B, d_in]` (predicting `target` when given); `fast=False`
        runs the dense reference path."""
        if fast:
            out = topk_sparse_forward(self, x, info.dead_mask, info.k_aux)
            x_hat, n_active, fired = out.x_hat, (out.vals > 0).sum(-1), out.fired
            aux = None if out.aux_idx is None else (out.aux_vals, out.aux_idx)
        else:
            pre = self.encode_pre(x)
            f = topk_code(pre, self.cfg.k)
            x_hat = self.decode(f)
            n_active, fired = (f > 0).sum(-1), (f > 0).sum(0)
            aux = auxk_select(pre, info.dead_mask, info.k_aux)
        x_hat = self.with_skip(x_hat, x)
        y = x if target is None else target
        metrics = step_metrics(y, x_hat, n_active, info)
        loss = metrics["fvu"]
        if aux is not None:
            metrics["auxk"] = auxk_loss(y - x_hat, aux[0], aux[1], self.W_dec)
            loss = loss + info.aux_coefficient * metrics["auxk"]
        return TrainStep(loss, {k: v.detach() for k, v in metrics.items()}, fired)
