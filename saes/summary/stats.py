"""Per-latent streaming statistics: counts, sums, maxima and a log-scale histogram.

Each latent's histogram covers the top `n_octaves` octaves below its scale
`hist_top = 2**e`, the smallest power of two above every activation seen, with
`bins_per_octave` bins per octave and one underflow bin for everything smaller. When a
larger activation raises `e` by `s`, the counts shift down by `s * bins_per_octave` bins
and the lowest ones merge into the underflow bin, so the state is a fixed
`[d_sae, n_bins + 1]` and the relative resolution is `2**(1/bins_per_octave)`.
Quantiles are read from the histogram by geometric interpolation inside a bin.
"""

from __future__ import annotations

import torch

from sae_atlas.saes.summary.batch import ActiveEntries

_UNSET = torch.iinfo(torch.int64).min // 4


class OctaveScale:
    """Per-latent top exponent `e` (scale `2**e` above every activation seen)."""

    def __init__(self, d_sae: int, bins_per_octave: int, device: torch.device | str = "cpu") -> None:
        self.bins_per_octave = bins_per_octave
        self.exponent = torch.full((d_sae,), _UNSET, dtype=torch.long, device=device)

    @property
    def seen(self) -> torch.Tensor:
        return self.exponent != _UNSET

    def update(self, entries: ActiveEntries) -> torch.Tensor:
        """Raise exponents to cover this batch; return each latent's shift in octaves (0 if new)."""
        batch_sub = torch.full_like(self.exponent, _UNSET)
        batch_sub.scatter_reduce_(0, entries.latent, entries.sub, reduce="amax")
        present = batch_sub != _UNSET
        needed = torch.div(batch_sub, self.bins_per_octave, rounding_mode="floor") + 1
        seen = self.seen
        new = torch.where(present, torch.where(seen, torch.maximum(self.exponent, needed), needed), self.exponent)
        shift = torch.where(seen & present, new - self.exponent, torch.zeros_like(new))
        self.exponent = new
        return shift


class LatentStats:
    """Token count, per-latent firing count, sum, max and the shifting log histogram."""

    def __init__(self, d_sae: int, n_octaves: int, bins_per_octave: int, device: torch.device | str = "cpu") -> None:
        self.n_bins = n_octaves * bins_per_octave
        self.bins_per_octave = bins_per_octave
        self.n_tokens = 0
        self.n_active = torch.zeros(d_sae, dtype=torch.long, device=device)
        self.sum = torch.zeros(d_sae, dtype=torch.float64, device=device)
        self.max = torch.zeros(d_sae, device=device)
        self.counts = torch.zeros(d_sae, self.n_bins + 1, dtype=torch.long, device=device)

    def _shift(self, shift_octaves: torch.Tensor) -> None:
        rows = shift_octaves.nonzero(as_tuple=True)[0]
        if len(rows) == 0:
            return
        old = self.counts[rows]
        bins = (shift_octaves[rows] * self.bins_per_octave).clamp(max=self.n_bins)[:, None]
        j = torch.arange(self.n_bins + 1, device=old.device)[None, :]
        src = j + bins
        moved = torch.where(src <= self.n_bins, old.gather(1, src.clamp(max=self.n_bins)), 0)
        moved[:, 0] = old.cumsum(1).gather(1, bins)[:, 0]
        self.counts[rows] = moved

    def update(self, n_valid: int, entries: ActiveEntries, exponent: torch.Tensor,
               shift_octaves: torch.Tensor) -> None:
        """Add a batch of `n_valid` tokens with non-zero `entries` (`exponent` already covers
        it; `shift_octaves` from `OctaveScale.update`)."""
        self.n_tokens += n_valid
        self.n_active += torch.bincount(entries.latent, minlength=len(self.n_active))
        self.sum.index_add_(0, entries.latent, entries.value.double())
        self.max.scatter_reduce_(0, entries.latent, entries.value, reduce="amax")
        self._shift(shift_octaves)
        top_sub = exponent[entries.latent] * self.bins_per_octave
        bins = (entries.sub - top_sub + self.n_bins + 1).clamp(min=0)
        flat = entries.latent * (self.n_bins + 1) + bins
        self.counts.view(-1).index_add_(0, flat, torch.ones_like(flat))

    def state_nbytes(self) -> int:
        """Bytes of state held (independent of the number of tokens seen)."""
        return sum(t.numel() * t.element_size() for t in (self.n_active, self.sum, self.max, self.counts))


def histogram_quantiles(
    counts: torch.Tensor, hist_top: torch.Tensor, bins_per_octave: int, levels: list[float],
    max_act: torch.Tensor,
) -> torch.Tensor:
    """Quantiles `[d_sae, len(levels)]` of each latent's non-zero activations from its log
    histogram (geometric interpolation in a bin, linear in the underflow bin, capped at the
    exact maximum); NaN for latents that never fired."""
    n_bins = counts.shape[1] - 1
    cum = counts.double().cumsum(1)
    total = cum[:, -1:]
    target = torch.tensor(levels, dtype=torch.float64, device=counts.device)[None, :] * total
    j = torch.searchsorted(cum, target.contiguous()).clamp(max=n_bins)
    in_bin = counts.double().gather(1, j)
    frac = ((target - (cum.gather(1, j) - in_bin)) / in_bin.clamp(min=1)).clamp(0, 1)
    top = hist_top.double()[:, None]
    hi = top * torch.exp2((j - n_bins).double() / bins_per_octave)
    lo = hi * 2.0 ** (-1.0 / bins_per_octave)
    value = torch.where(j == 0, frac * hi, lo * (hi / lo) ** frac)
    value = torch.minimum(value, max_act.double()[:, None])
    return torch.where(total > 0, value, torch.nan).float()
