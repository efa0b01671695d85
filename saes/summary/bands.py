"""Seeded samples of each latent's activations in octave bands below its maximum.

Band b of a latent holds its activations in `[2**(e-b-1), 2**(e-b))`, where `2**e` is
the latent's histogram scale (`hist_top`). Within each band the sampler keeps the
`per_band` activations whose priority key `hash(seed, token, latent)` is smallest
(bottom-k / priority sampling): a uniform sample without replacement of that band's
tokens. The keys do not depend on batch order, so the result is the same for any batch
size: the bottom-k of a union is the bottom-k of the parts' bottom-ks. When `e` grows by
s octaves, a latent's bands move s places down (and drop out past the last).
"""

from __future__ import annotations

import torch

from sae_atlas.saes.summary.batch import ActiveEntries, BatchInfo, empty_payload, example_payload
from sae_atlas.saes.summary.slots import SlotTable, with_tie_break

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift / multiply rounds; constants below 2**31 so the
    products fit in int64), computed in place on a copy of `x`."""
    x = x ^ (x >> 16)
    x.mul_(0x7FEB352D).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x5BD1E995).bitwise_and_(_MASK32)
    return x.bitwise_xor_(x >> 16)


def latent_salts(latent: torch.Tensor, seed: int) -> torch.Tensor:
    """The per-latent half of the priority key, fixed by `seed` (a table over all latents
    is computed once per sampler)."""
    salt = _mix32(torch.tensor(seed & _MASK32, dtype=torch.long))
    return _mix32((latent & _MASK32) ^ salt.to(latent.device))


def token_keys(global_token: torch.Tensor, salt: torch.Tensor) -> torch.Tensor:
    """Keys in `[0, 2**32)` of tokens paired with latents whose `latent_salts` are `salt`."""
    return _mix32((global_token ^ (global_token >> 32) ^ salt) & _MASK32)


class BandSampler:
    """`per_band` uniformly sampled examples in each of `n_bands` octave bands per latent
    (a `SlotTable` with one row per (latent, band); smaller priority keys score higher)."""

    def __init__(self, d_sae: int, n_bands: int, per_band: int, before: int, after: int,
                 bins_per_octave: int, seed: int, device: torch.device | str = "cpu") -> None:
        self.d_sae, self.n_bands, self.per_band = d_sae, n_bands, per_band
        self.before, self.after = before, after
        self.bins_per_octave, self.seed = bins_per_octave, seed
        payload = empty_payload((d_sae * n_bands, per_band), before + after + 1, device)
        payload["value"] = torch.zeros(d_sae * n_bands, per_band, device=device)
        self.table = SlotTable(d_sae * n_bands, per_band, payload)
        self.salt_F = latent_salts(torch.arange(d_sae, device=device), seed)

    def shift(self, shift_octaves: torch.Tensor) -> None:
        """Move the bands of latents whose scale rose by `shift_octaves` octaves."""
        latents = shift_octaves.nonzero(as_tuple=True)[0]
        if len(latents) == 0:
            return
        band = torch.arange(self.n_bands, device=latents.device)[None, :]
        source = band - shift_octaves[latents][:, None]  # [m, n_bands]
        inside = source >= 0
        tensors = {"score": self.table.score, **self.table.payload}
        for name, tensor in tensors.items():
            view = tensor.view(self.d_sae, self.n_bands, *tensor.shape[1:])
            old = view[latents]
            index = source.clamp(min=0).view(*source.shape, *[1] * (old.dim() - 2)).expand_as(old)
            moved = old.gather(1, index)
            empty = self.table.empty if name == "score" else (-1 if name in ("block", "win_tokens") else 0)
            mask = inside.view(*inside.shape, *[1] * (old.dim() - 2))
            view[latents] = torch.where(mask, moved, torch.full_like(moved, empty))

    def update(self, f_NF: torch.Tensor, info: BatchInfo, entries: ActiveEntries, exponent: torch.Tensor) -> None:
        """Offer a batch's active entries (`exponent` already covers the batch, `shift` done)."""
        octave = torch.div(entries.sub, self.bins_per_octave, rounding_mode="floor")
        band = exponent[entries.latent] - octave - 1
        in_bands = band < self.n_bands
        offer = None if bool(in_bands.all()) else in_bands.nonzero(as_tuple=True)[0]
        t, latent = (entries.t, entries.latent) if offer is None else (entries.t[offer], entries.latent[offer])
        token = info.global_id[t]
        key = token_keys(token, self.salt_F[latent])

        def build(i: torch.Tensor) -> dict[str, torch.Tensor]:
            j = i if offer is None else offer[i]
            payload = example_payload(f_NF, info, entries.t[j], entries.latent[j], self.before, self.after)
            return {**payload, "value": entries.value[j]}

        row = latent * self.n_bands + (band if offer is None else band[offer])
        self.table.offer(row, with_tie_break(_MASK32 - key, token), build)

    def entries(self, exponent: torch.Tensor) -> dict[str, torch.Tensor]:
        """Filled slots as flat tensors `latent`, `band`, `band_lo`, `band_hi`, `rank`,
        `act` and payload, sorted by latent, band, then activation (highest first)."""
        row, rank, act, payload = self.table.ranked()
        latent = torch.div(row, self.n_bands, rounding_mode="floor")
        band = row - latent * self.n_bands
        top = exponent[latent].double()
        out = {"latent": latent, "band": band, "band_lo": torch.exp2(top - band - 1),
               "band_hi": torch.exp2(top - band), "rank": rank, "act": act}
        out.update(payload)
        return out

    def state_nbytes(self) -> int:
        """Bytes of state held (fixed: d_sae * n_bands * per_band slots)."""
        return self.table.nbytes()
