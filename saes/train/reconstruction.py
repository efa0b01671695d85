"""Streaming reconstruction and sparsity metrics of an SAE (SAEBench names, correct formulas).

`ReconstructionStats` accumulates, in float64, everything the metrics need over any
number of token batches: squared errors, per-dimension sums and sums of squares of `x`
(shifted by the first batch's mean, which keeps the variance accurate for activations
with a large mean), norms, inner products, cosines and per-latent firing counts.

- `explained_variance = 1 - E_t||x_t - x_hat_t||^2 / sum_d Var(x_d)`; `fvu` is 1 minus that.
  (SAEBench's code squares before averaging and so divides by roughly `E||x||^2`, which
  counts the mean as explained and inflates the score on residual streams with a large mean.)
- `mse` = mean squared error per element; `cossim` = mean cos(x, x_hat);
  `l2_norm_in` / `l2_norm_out` = mean norms; `l2_ratio` = mean ||x_hat|| / ||x||;
  `relative_reconstruction_bias` = E||x_hat||^2 / E<x, x_hat> (Wright & Sharkey 2024).
- `l0` = mean number of non-zero latents per token; `l1` = mean sum of |f|.
- density_i = fraction of tokens with f_i != 0; `dead_fraction` = share of latents with
  density 0; `dense_fraction` = share with density > 10%.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.train.paired_rows import input_and_target

DENSE_DENSITY = 0.1
HISTOGRAM_EDGES = np.arange(-8.0, 0.0001, 0.5)  # log10 density bins, fixed so SAEs compare


class ReconstructionStats:
    """Accumulates reconstruction metrics over batches; `result()` gives the metric dict."""

    def __init__(self, d_in: int, d_sae: int) -> None:
        self.d_in = d_in
        self.d_sae = d_sae
        self.n = 0
        self._shift: torch.Tensor | None = None
        self._sum = torch.zeros(d_in, dtype=torch.float64)
        self._sum_sq = torch.zeros(d_in, dtype=torch.float64)
        self._fired = torch.zeros(d_sae, dtype=torch.float64)
        self._totals = dict.fromkeys(
            ("sse", "cos", "norm_in", "norm_out", "ratio", "out_sq", "inner", "l0", "l1"), 0.0
        )

    @torch.no_grad()
    def update(self, x: torch.Tensor, x_hat: torch.Tensor, feature_acts: torch.Tensor) -> None:
        """Add a batch: inputs `x [B, d_in]`, reconstructions `x_hat [B, d_in]`, code `[B, d_sae]`."""
        if x.shape != x_hat.shape or x.shape[-1] != self.d_in or feature_acts.shape != (x.shape[0], self.d_sae):
            raise InvalidInputError(
                f"expected x and x_hat [B, {self.d_in}] and feature_acts [B, {self.d_sae}], got "
                f"{tuple(x.shape)}, {tuple(x_hat.shape)}, {tuple(feature_acts.shape)}"
            )
        if x.shape[0] == 0:
            return
        x64, xh64 = x.detach().double().cpu(), x_hat.detach().double().cpu()
        if self._shift is None:
            self._shift = x64.mean(0)
        centred = x64 - self._shift
        self._sum += centred.sum(0)
        self._sum_sq += centred.pow(2).sum(0)
        norm_in, norm_out = x64.norm(dim=-1), xh64.norm(dim=-1)
        inner = (x64 * xh64).sum(-1)
        tiny = torch.finfo(torch.float64).tiny
        active = (feature_acts != 0).cpu()
        t = self._totals
        t["sse"] += float((x64 - xh64).pow(2).sum())
        t["cos"] += float((inner / (norm_in * norm_out).clamp_min(tiny)).sum())
        t["norm_in"] += float(norm_in.sum())
        t["norm_out"] += float(norm_out.sum())
        t["ratio"] += float((norm_out / norm_in.clamp_min(tiny)).sum())
        t["out_sq"] += float(norm_out.pow(2).sum())
        t["inner"] += float(inner.sum())
        t["l0"] += float(active.sum())
        t["l1"] += float(feature_acts.detach().abs().double().sum())
        self._fired += active.sum(0).double()
        self.n += x.shape[0]

    def merge_(self, other: ReconstructionStats) -> ReconstructionStats:
        """Add the statistics of `other` (e.g. another rank's tokens) in place: the result
        equals one accumulation over both sets of tokens up to float64 rounding. `other`'s
        centred sums are moved onto this shift first."""
        if (other.d_in, other.d_sae) != (self.d_in, self.d_sae):
            raise InvalidInputError(f"cannot merge statistics of shape {(other.d_in, other.d_sae)} "
                                    f"into {(self.d_in, self.d_sae)}")
        if other.n == 0:
            return self
        if self._shift is None:
            self._shift = other._shift
        delta = other._shift - self._shift
        self._sum += other._sum + other.n * delta
        self._sum_sq += other._sum_sq + 2 * delta * other._sum + other.n * delta.pow(2)
        self._fired += other._fired
        for key, value in other._totals.items():
            self._totals[key] += value
        self.n += other.n
        return self

    @property
    def total_variance(self) -> float:
        """`sum_d Var(x_d)` over the tokens seen so far."""
        mean = self._sum / max(self.n, 1)
        return float((self._sum_sq / max(self.n, 1) - mean.pow(2)).clamp_min(0).sum())

    def density(self) -> torch.Tensor:
        """Per-latent firing density `[d_sae]` (float32) over the tokens seen."""
        return (self._fired / max(self.n, 1)).float()

    def result(self) -> dict[str, Any]:
        """The metrics (floats; None where undefined) plus `n_tokens` and the density histogram."""
        if self.n == 0:
            raise InvalidInputError("no tokens were evaluated (empty batches or split)")
        n, t = self.n, self._totals
        variance = self.total_variance
        fvu = t["sse"] / n / variance if variance > 0 else None
        density = self.density()
        return {
            "n_tokens": n,
            "explained_variance": None if fvu is None else 1.0 - fvu,
            "fvu": fvu,
            "mse": t["sse"] / (n * self.d_in),
            "cossim": t["cos"] / n,
            "l2_norm_in": t["norm_in"] / n,
            "l2_norm_out": t["norm_out"] / n,
            "l2_ratio": t["ratio"] / n,
            "relative_reconstruction_bias": t["out_sq"] / t["inner"] if t["inner"] != 0 else None,
            "l0": t["l0"] / n,
            "l1": t["l1"] / n,
            "dead_fraction": float((density == 0).float().mean()),
            "dense_fraction": float((density > DENSE_DENSITY).float().mean()),
            "density_histogram": density_histogram(density),
        }


def density_histogram(density: torch.Tensor) -> dict[str, Any]:
    """Counts of latents per log10-density bin (edges -8..0 step 0.5; lower densities fall
    in the first bin); dead latents (density 0) are counted separately."""
    alive = density[density > 0].double().numpy()
    logs = np.clip(np.log10(alive), HISTOGRAM_EDGES[0], HISTOGRAM_EDGES[-1])
    counts, _ = np.histogram(logs, bins=HISTOGRAM_EDGES)
    return {
        "log10_density_edges": HISTOGRAM_EDGES.tolist(),
        "counts": counts.tolist(),
        "dead": int((density == 0).sum()),
    }


@torch.no_grad()
def reconstruction_stats(sae: SAE, rows: Iterable[torch.Tensor], batch_size: int = 4096) -> ReconstructionStats:
    """Stream activation rows `[n, d_in]` through `sae` (in eval mode, restored afterwards)
    in chunks of `batch_size` and return the accumulated statistics. A transcoder's rows
    are paired `[n, d_in + d_out]` (`saes.train.paired_rows`) and its statistics measure
    the predicted output against the output part."""
    stats = ReconstructionStats(sae.cfg.output_dim, sae.cfg.d_sae)
    param = sae.W_enc
    was_training = sae.training
    sae.eval()
    try:
        for chunk_rows in rows:
            for chunk in chunk_rows.split(batch_size):
                x, target = input_and_target(sae.cfg, chunk)
                out = sae(x.to(param.device, param.dtype))
                stats.update(target, out.x_hat.float(), out.feature_acts)
    finally:
        sae.train(was_training)
    return stats


def reconstruction_metrics(sae: SAE, rows: Iterable[torch.Tensor], batch_size: int = 4096) -> dict[str, Any]:
    """Reconstruction / sparsity metrics of `sae` (in eval mode) over activation rows `[n, d_in]`
    (InvalidInputError when there are none)."""
    return reconstruction_stats(sae, rows, batch_size).result()
