"""Exact top-k activating tokens per latent, with context windows (a `SlotTable` per latent).

Slots are unordered while streaming; `entries()` returns them sorted by activation.
"""

from __future__ import annotations

import torch

from sae_atlas.saes.summary.batch import ActiveEntries, BatchInfo, empty_payload, example_payload
from sae_atlas.saes.summary.slots import SlotTable, with_tie_break


class TopExamples:
    """The exact k highest activations of every latent seen so far, with context windows."""

    def __init__(self, d_sae: int, k: int, before: int, after: int, device: torch.device | str = "cpu") -> None:
        self.before, self.after = before, after
        payload = empty_payload((d_sae, k), before + after + 1, device)
        payload["value"] = torch.zeros(d_sae, k, device=device)
        self.table = SlotTable(d_sae, k, payload)

    def update(self, f_NF: torch.Tensor, info: BatchInfo, entries: ActiveEntries) -> None:
        """Offer a batch's non-zero `entries` (windows read from `f_NF`)."""
        def build(i: torch.Tensor) -> dict[str, torch.Tensor]:
            payload = example_payload(f_NF, info, entries.t[i], entries.latent[i], self.before, self.after)
            return {**payload, "value": entries.value[i]}

        bits = entries.value.float().view(torch.int32).long()  # monotone for positive floats
        score = with_tie_break(bits, info.global_id[entries.t])
        self.table.offer(entries.latent, score, build)

    def entries(self) -> dict[str, torch.Tensor]:
        """Filled slots as flat tensors `latent`, `rank`, `act` and payload, sorted by
        latent then activation (highest first)."""
        latent, rank, act, payload = self.table.ranked()
        return {"latent": latent, "rank": rank, "act": act, **payload}

    def state_nbytes(self) -> int:
        """Bytes of state held (fixed: d_sae * k slots)."""
        return self.table.nbytes()
