"""Seeded samples of each latent's activations in octave bands below its maximum.

Band b of a latent holds its activations in `[2**(e-b-1), 2**e-b)`, where `2**e` is the
latent's histogram scale (`hist_top`). Within each band the sampler keeps the
`per_band` activations whose priority key `hash(seed, token, latent)` is smallest
(bottom-k / priority sampling): a uniform sample without replacement of that band's
tokens. The keys do not depend on batch order, so the result is the same for any batch
size; the union of the kept samples of two streams contains the kept samples of their
concatenation, which is what makes the merge exact. Entries remember the octave of their
value, so when `e` grows they move to a lower band (and drop out past the last).
"""

from __future__ import annotations

import torch

from saes.summary.batch import ActiveEntries, BatchInfo, empty_payload, example_payload

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift / multiply rounds; constants below 2**31 so the
    products fit in int64)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _MASK32
    return x ^ (x >> 16)


def priority_keys(global_token: torch.Tensor, latent: torch.Tensor, seed: int) -> torch.Tensor:
    """Pseudo-random keys in `[0, 2**32)` for (token, latent) pairs, fixed by `seed`."""
    salt = _mix32(torch.tensor(seed & _MASK32, dtype=torch.long))
    inner = _mix32((latent & _MASK32) ^ salt.to(latent.device))
    return _mix32((global_token ^ (global_token >> 32) ^ inner) & _MASK32)


class BandSampler:
    """`per_band` uniformly sampled examples in each of `n_bands` octave bands per latent."""

    def __init__(self, d_sae: int, n_bands: int, per_band: int, before: int, after: int,
                 bins_per_octave: int, seed: int, device: torch.device | str = "cpu") -> None:
        self.n_bands, self.per_band = n_bands, per_band
        self.before, self.after = before, after
        self.bins_per_octave, self.seed = bins_per_octave, seed
        self.latent = torch.zeros(0, dtype=torch.long, device=device)
        self.key = torch.zeros(0, dtype=torch.long, device=device)
        self.octave = torch.zeros(0, dtype=torch.long, device=device)  # floor(log2(value))
        self.value = torch.zeros(0, device=device)
        self.payload = empty_payload((0,), before + after + 1, device)

    def bands(self, exponent: torch.Tensor) -> torch.Tensor:
        """Current band of each kept entry under the latents' exponents."""
        return exponent[self.latent] - self.octave - 1

    def _state(self) -> dict[str, torch.Tensor]:
        return {"latent": self.latent, "key": self.key, "octave": self.octave, "value": self.value,
                **self.payload}

    def update(self, f_NF: torch.Tensor, info: BatchInfo, entries: ActiveEntries, exponent: torch.Tensor) -> None:
        """Offer a batch's active entries (`exponent` already covers the batch)."""
        state = self._state()
        alive = (self.bands(exponent) < self.n_bands).nonzero(as_tuple=True)[0]
        state = {name: tensor[alive] for name, tensor in state.items()}
        octave = torch.div(entries.sub, self.bins_per_octave, rounding_mode="floor")
        band = exponent[entries.latent] - octave - 1
        offer = (band < self.n_bands).nonzero(as_tuple=True)[0]
        offer_latent = entries.latent[offer]
        offer_key = priority_keys(info.global_id[entries.t[offer]], offer_latent, self.seed)
        n_state = len(state["latent"])
        latent = torch.cat([state["latent"], offer_latent])
        group = latent * self.n_bands + torch.cat([exponent[state["latent"]] - state["octave"] - 1, band[offer]])
        order = torch.sort(group * (1 << 32) + torch.cat([state["key"], offer_key]), stable=True).indices
        _, counts = torch.unique_consecutive(group[order], return_counts=True)
        rank = torch.arange(len(order), device=order.device) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        kept = order[rank < self.per_band]
        old = kept[kept < n_state]
        new = offer[kept[kept >= n_state] - n_state]
        fresh = {
            "latent": entries.latent[new],
            "key": offer_key[kept[kept >= n_state] - n_state],
            "octave": octave[new],
            "value": entries.value[new],
            **example_payload(f_NF, info, entries.t[new], entries.latent[new], self.before, self.after),
        }
        merged = {name: torch.cat([tensor[old], fresh[name].to(tensor.dtype)]) for name, tensor in state.items()}
        self.latent, self.key = merged.pop("latent"), merged.pop("key")
        self.octave, self.value = merged.pop("octave"), merged.pop("value")
        self.payload = merged

    def state_nbytes(self) -> int:
        """Bytes of state held (at most d_sae * n_bands * per_band entries)."""
        return sum(t.numel() * t.element_size() for t in self._state().values())
