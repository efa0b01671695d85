"""A summary accumulator as plain tensors (checkpoints, transfer between ranks) and the
exact merge of accumulators that saw disjoint tokens.

Merging aligns each latent's histogram and activation bands to the larger of the two
scales (the same shift a single pass applies when a larger activation arrives), adds
counts, sums and token counts, takes the maxima, and keeps per slot row the best
`slots` entries of the union (the top-k of a union is the top-k of the parts' top-ks;
the same holds for the bottom-k priority samples of each band). Everything but the
float64 activation sums is therefore bit-identical to one pass over all the tokens; the
sums differ by float64 rounding of a different addition order (relative 1e-15).
"""

from __future__ import annotations

from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.summary.accumulator import SummaryAccumulator, SummaryParams
from sae_atlas.saes.summary.slots import SlotTable
from sae_atlas.saes.summary.stats import _UNSET

_STAT_FIELDS = ("n_active", "sum", "max", "counts")


def _table_state(table: SlotTable) -> dict[str, torch.Tensor]:
    return {"score": table.score.cpu(), **{name: t.cpu() for name, t in table.payload.items()}}


def _load_table(table: SlotTable, state: dict[str, torch.Tensor]) -> None:
    table.score = state["score"].to(table.score.device)
    for name in table.payload:
        table.payload[name] = state[name].to(table.payload[name].device)


def accumulator_state(acc: SummaryAccumulator) -> dict[str, Any]:
    """Everything `restore_accumulator` needs, as CPU tensors and ints."""
    return {
        "d_sae": acc.d_sae,
        "n_tokens": acc.stats.n_tokens,
        "exponent": acc.scale.exponent.cpu(),
        **{name: getattr(acc.stats, name).cpu() for name in _STAT_FIELDS},
        "top": _table_state(acc.top.table),
        "bands": _table_state(acc.bands.table),
    }


def restore_accumulator(state: dict[str, Any], params: SummaryParams,
                        device: torch.device | str = "cpu") -> SummaryAccumulator:
    """The accumulator `state` was taken from (same `params`), on `device`."""
    acc = SummaryAccumulator(state["d_sae"], params, device)
    acc.stats.n_tokens = int(state["n_tokens"])
    acc.scale.exponent = state["exponent"].to(device)
    for name in _STAT_FIELDS:
        setattr(acc.stats, name, state[name].to(device))
    _load_table(acc.top.table, state["top"])
    _load_table(acc.bands.table, state["bands"])
    return acc


def _merge_tables(into: SlotTable, other: SlotTable) -> None:
    """Keep, per row, the best `slots` entries of both tables."""
    score = torch.cat([into.score, other.score.to(into.score.device)], dim=1)
    keep = score.topk(into.slots, dim=1).indices
    into.score = score.gather(1, keep)
    for name, tensor in into.payload.items():
        both = torch.cat([tensor, other.payload[name].to(tensor.device)], dim=1)
        index = keep.view(*keep.shape, *[1] * (both.dim() - 2)).expand(*keep.shape, *both.shape[2:])
        into.payload[name] = both.gather(1, index)


def merge_into(acc: SummaryAccumulator, other: SummaryAccumulator) -> None:
    """Add `other` (disjoint tokens, same parameters; modified in place) into `acc` exactly."""
    if acc.d_sae != other.d_sae or acc.params != other.params:
        raise InvalidInputError("only accumulators of the same SAE width and parameters merge")
    mine = acc.scale.exponent
    theirs = other.scale.exponent.to(mine.device)
    both = (mine != _UNSET) & (theirs != _UNSET)
    merged = torch.where(both, torch.maximum(mine, theirs), torch.where(mine != _UNSET, mine, theirs))
    zero = torch.zeros_like(merged)
    for part, exponent in ((acc, mine), (other, theirs)):
        shift = torch.where(both, merged - exponent, zero).to(part.scale.exponent.device)
        part.stats._shift(shift)
        part.bands.shift(shift)
    acc.scale.exponent = merged
    s, o = acc.stats, other.stats
    s.n_tokens += o.n_tokens
    s.n_active += o.n_active.to(s.n_active.device)
    s.sum += o.sum.to(s.sum.device)
    s.max = torch.maximum(s.max, o.max.to(s.max.device))
    s.counts += o.counts.to(s.counts.device)
    _merge_tables(acc.top.table, other.top.table)
    _merge_tables(acc.bands.table, other.bands.table)
