"""A fixed table of `slots` best-scoring entries per row, updated in place batch by batch.

Used for the exact top-k examples (row = latent, score = the activation's float32 bit
pattern, which orders positive floats) and for the band samples (row = latent x band,
score = 2**32 - 1 - priority key), each made unique per token by `with_tie_break` (the
earlier token wins a tie), so which entries a row keeps does not depend on batching or
on how the tokens were split between processes. Scores are integers in [0, 2**63). An
update keeps only offers that beat their row's worst slot, ranks them per row (stable
sorts by score, then row), merges
each touched row with one `topk` over `[touched, 2 * slots]`, and writes the entering
offers into the slots they evict, so untouched rows and surviving slots are never
copied and payload (context windows) is built only for entering offers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_TOKEN = (1 << 31) - 1


def with_tie_break(score: torch.Tensor, global_token: torch.Tensor) -> torch.Tensor:
    """A score in [0, 2**32) made unique per token: `score * 2**31 + (2**31 - 1 - token)`
    (token ids taken modulo 2**31), so of two equal scores the earlier token ranks higher."""
    return score * (1 << 31) + (_TOKEN - (global_token & _TOKEN))


class SlotTable:
    """Per row, the `slots` highest-scoring entries offered so far, with their payload."""

    empty = -1

    def __init__(self, n_rows: int, slots: int, payload: dict[str, torch.Tensor]) -> None:
        self.slots = slots
        device = next(iter(payload.values())).device
        self.score = torch.full((n_rows, slots), self.empty, dtype=torch.long, device=device)
        self.payload = payload  # each [n_rows, slots, ...]

    def offer(self, row: torch.Tensor, score: torch.Tensor,
              build: Callable[[torch.Tensor], dict[str, torch.Tensor]]) -> None:
        """Offer entries (`row[i]`, integer `score[i]` in [0, 2**63)); `build(indices)` returns
        the payload of the offered entries at those indices (called once, for entries that enter)."""
        index = (score > self.score.min(dim=1).values[row]).nonzero(as_tuple=True)[0]
        if len(index) == 0:
            return
        index = index[torch.sort(score[index], descending=True, stable=True).indices]
        index = index[torch.sort(row[index], stable=True).indices]
        rows, counts = torch.unique_consecutive(row[index], return_counts=True)
        starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        rank = torch.arange(len(index), device=index.device) - starts
        touched = torch.repeat_interleave(torch.arange(len(rows), device=index.device), counts)
        keep = rank < self.slots
        index, rank, touched = index[keep], rank[keep], touched[keep]
        # unused candidate cells score below an empty slot, so only real offers ever enter
        cand_score = torch.full((len(rows), self.slots), self.empty - 1, dtype=self.score.dtype, device=index.device)
        cand_index = torch.zeros((len(rows), self.slots), dtype=torch.long, device=index.device)
        cand_score[touched, rank] = score[index]
        cand_index[touched, rank] = index
        merged = torch.cat([self.score[rows], cand_score], dim=1).topk(self.slots, dim=1).indices
        survives = torch.zeros((len(rows), 2 * self.slots), dtype=torch.bool, device=index.device)
        survives.scatter_(1, merged, True)
        # per touched row, evicted state slots and entering offers are equally many; both
        # lists are row-major, so they pair up in order
        out_row, out_slot = (~survives[:, : self.slots]).nonzero(as_tuple=True)
        in_row, in_col = survives[:, self.slots :].nonzero(as_tuple=True)
        target_row = rows[out_row]
        self.score[target_row, out_slot] = cand_score[in_row, in_col]
        fresh = build(cand_index[in_row, in_col])
        for name, tensor in self.payload.items():
            tensor[target_row, out_slot] = fresh[name].to(tensor.dtype)

    def filled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, slot) of every non-empty slot."""
        return (self.score != self.empty).nonzero(as_tuple=True)

    def ranked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Every filled slot, sorted by row, then by its payload `value` (highest first), then
        by score: `(row, rank within the row, value, the other payload fields)`."""
        row, slot = self.filled()
        value = self.payload["value"][row, slot]
        order = torch.sort(self.score[row, slot], descending=True, stable=True).indices
        order = order[torch.sort(value[order], descending=True, stable=True).indices]
        order = order[torch.sort(row[order], stable=True).indices]
        row, slot, value = row[order], slot[order], value[order]
        _, counts = torch.unique_consecutive(row, return_counts=True)
        rank = torch.arange(len(row), device=row.device) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        return row, rank, value, {name: t[row, slot] for name, t in self.payload.items() if name != "value"}

    def nbytes(self) -> int:
        """Bytes of state (fixed at construction)."""
        return sum(t.numel() * t.element_size() for t in (self.score, *self.payload.values()))
