"""Running sums for the Pearson correlation of every latent of SAE A with every latent of
SAE B, streamed over any number of tokens.

Memory is `O(F * G)` (float64 sums) whatever the token count; each batch's cross product
`a^T b` is a sparse-by-dense product (SAE codes are sparse), so its cost is
`nnz(a) * G`. Under torchrun every rank accumulates its own tokens and `merge` sums
the ranks' statistics exactly (`saes.distributed.all_reduce_`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.similarity import pearson_from_sums
from sae_atlas.saes.distributed import DistContext, all_reduce_


@dataclass
class CorrelationSums:
    """`n`, per-side `sum x` and `sum x^2`, and `sum x_a x_b` of every pair, in float64."""

    n: torch.Tensor  # [] token count
    sum_a: torch.Tensor  # [F]
    sum_b: torch.Tensor  # [G]
    sq_a: torch.Tensor  # [F]
    sq_b: torch.Tensor  # [G]
    cross: torch.Tensor  # [F, G]
    fires_a: torch.Tensor  # [F] tokens on which each latent of A fired (> 0)
    fires_b: torch.Tensor  # [G]

    @classmethod
    def zeros(cls, d_a: int, d_b: int, device: str | torch.device = "cpu") -> CorrelationSums:
        """Empty sums for `d_a` latents of A and `d_b` of B on `device`."""
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        return cls(z(()), z(d_a), z(d_b), z(d_a), z(d_b), z(d_a, d_b), z(d_a), z(d_b))

    @torch.no_grad()
    def update(self, a_NF: torch.Tensor, b_NG: torch.Tensor) -> None:
        """Add `N` paired tokens' codes (rows of `a` and `b` are the same tokens)."""
        if a_NF.shape[0] != b_NG.shape[0] or a_NF.shape[1:] != self.sum_a.shape or b_NG.shape[1:] != self.sum_b.shape:
            raise InvalidInputError(f"paired codes must be [N, {len(self.sum_a)}] and [N, {len(self.sum_b)}], got "
                                    f"{tuple(a_NF.shape)} and {tuple(b_NG.shape)}")
        a = a_NF.to(self.cross.device, torch.float32)
        b = b_NG.to(self.cross.device, torch.float32)
        self.n += a.shape[0]
        self.sum_a += a.sum(0).double()
        self.sum_b += b.sum(0).double()
        self.sq_a += (a.double() ** 2).sum(0)
        self.sq_b += (b.double() ** 2).sum(0)
        self.cross += torch.sparse.mm(a.T.to_sparse(), b).double()
        self.fires_a += (a > 0).sum(0).double()
        self.fires_b += (b > 0).sum(0).double()

    def merge(self, ctx: DistContext | None) -> None:
        """Sum every rank's statistics in place (a no-op without a process group)."""
        for t in (self.n, self.sum_a, self.sum_b, self.sq_a, self.sq_b, self.cross, self.fires_a, self.fires_b):
            all_reduce_(t, ctx)

    def correlation(self) -> np.ndarray:
        """Pearson correlation `[F, G]` of the tokens seen (dead latents correlate 0)."""
        return pearson_from_sums(float(self.n), *(t.cpu().numpy() for t in (
            self.sum_a, self.sum_b, self.sq_a, self.sq_b, self.cross)))
