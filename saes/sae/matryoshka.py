"""Matryoshka BatchTopK SAE (Bussmann et al. 2025, "Learning Multi-Level Features with
Matryoshka Sparse Autoencoders"; Nabeshima 2024, "Matryoshka Sparse Autoencoders").

The code is a batch top-k code over the whole dictionary, but the loss averages the FVU
of reconstructions from nested prefixes of the dictionary (latents `[0, m)` for each
prefix size m), so early latents must reconstruct well on their own and learn general
features while later ones refine. Inference is the BatchTopK JumpReLU threshold.
"""

from __future__ import annotations

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.sae.batchtopk import BatchTopKSAE
from sae_atlas.saes.sae.losses import StepInfo, normalised_error


def matryoshka_prefixes(cfg: SAEConfig) -> list[int]:
    """The prefix sizes: `cfg.matryoshka_prefixes`, or d_sae/16, /8, /4, /2, d_sae."""
    prefixes = list(cfg.matryoshka_prefixes) or [
        m for m in (cfg.d_sae // 16, cfg.d_sae // 8, cfg.d_sae // 4, cfg.d_sae // 2) if m > 0
    ] + [cfg.d_sae]
    ordered = sorted(set(prefixes))
    if ordered != prefixes or ordered[0] <= 0 or ordered[-1] != cfg.d_sae:
        raise InvalidInputError(
            f"matryoshka_prefixes must be strictly increasing positive sizes ending at "
            f"d_sae={cfg.d_sae}, got {prefixes}"
        )
    return prefixes


class MatryoshkaSAE(BatchTopKSAE):
    """BatchTopK SAE trained with nested-prefix reconstruction losses."""

    architecture = "matryoshka"

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__(cfg)
        self.prefixes = matryoshka_prefixes(cfg)

    def _reconstruction_loss(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        x_hat: torch.Tensor,
        f: torch.Tensor,
        info: StepInfo,
        metrics: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        partial = self.with_skip(self.b_dec.expand_as(y), x)
        start = 0
        fvus = []
        for end in self.prefixes[:-1]:
            partial = partial + f[:, start:end] @ self.W_dec[start:end]
            fvus.append(normalised_error(y, partial, info))
            start = end
        fvus.append(metrics["fvu"])
        metrics["loss_first_prefix"] = fvus[0]
        return torch.stack(fvus).mean()
