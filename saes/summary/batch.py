"""One batch of whole blocks as the accumulators see it, and the example payload gather.

Activations are flattened to `f_NF [N = n_blocks * T, d_sae]`; BOS positions are
excluded (`valid` False) from every statistic and show activation 0 in windows.
A token is addressed inside the batch by its flat row `t`; its global id is
`block * T + pos`. Every activation `v > 0` is placed on a log grid by
`sub = floor(log2(v) * bins_per_octave)`, the integer shared by the histogram and the
activation bands so both agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchInfo:
    """Token metadata of a batch, each `[N]` (flat over blocks x positions)."""

    token_ids: torch.Tensor  # int64
    block: torch.Tensor  # int64 global block index
    pos: torch.Tensor  # int64 position in block
    doc: torch.Tensor  # int64 document id
    valid: torch.Tensor  # bool, False at BOS positions
    context: int  # T

    @property
    def global_id(self) -> torch.Tensor:
        return self.block * self.context + self.pos


@dataclass
class ActiveEntries:
    """The non-zero activations of a batch: flat token row, latent, value and grid index."""

    t: torch.Tensor  # [E] int64
    latent: torch.Tensor  # [E] int64
    value: torch.Tensor  # [E] float32
    sub: torch.Tensor  # [E] int64 = floor(log2(value) * bins_per_octave)

    @classmethod
    def of(cls, f_NF: torch.Tensor, valid: torch.Tensor, bins_per_octave: int) -> ActiveEntries:
        """The entries `f > 0` of the rows where `valid` (BOS rows dropped), in row-major order.

        One pass finds the flat indices of the positive cells (BOS rows cleared in the mask
        first, so nothing is filtered afterwards); values are read with one flat `take`."""
        active_NF = f_NF > 0
        active_NF.index_fill_(0, (~valid).nonzero().squeeze(1), False)
        flat = active_NF.view(-1).nonzero().squeeze(1)
        d_sae = f_NF.shape[1]
        t = torch.div(flat, d_sae, rounding_mode="floor")
        latent = flat - t * d_sae
        value = f_NF.reshape(-1).take(flat)
        sub = torch.floor(torch.log2(value) * bins_per_octave).long()
        return cls(t, latent, value, sub)


def example_payload(
    f_NF: torch.Tensor, info: BatchInfo, t: torch.Tensor, latent: torch.Tensor, before: int, after: int
) -> dict[str, torch.Tensor]:
    """Payload of examples `(t, latent)`: block, pos, doc and the window of token ids and this
    latent's activations from `before` tokens before to `after` after (within the block;
    positions outside it are token -1, activation 0; BOS positions show activation 0)."""
    T = info.context
    offsets = torch.arange(-before, after + 1, device=t.device)
    pos = info.pos[t]
    q = pos[:, None] + offsets[None, :]
    inside = (q >= 0) & (q < T)
    src = (t - pos)[:, None] + q.clamp(0, T - 1)
    shown = inside & info.valid[src]
    cells = src * f_NF.shape[1] + latent[:, None]
    win_acts = torch.where(shown, f_NF.reshape(-1).take(cells), torch.zeros((), device=t.device))
    win_tokens = torch.where(inside, info.token_ids[src], torch.full((), -1, device=t.device))
    return {
        "block": info.block[t],
        "pos": pos,
        "doc": info.doc[t],
        "win_acts": win_acts.float(),
        "win_tokens": win_tokens.to(torch.int32),
    }


def empty_payload(shape: tuple[int, ...], width: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Placeholder payload tensors of leading shape `shape` for windows of `width` tokens."""
    return {
        "block": torch.full(shape, -1, dtype=torch.long, device=device),
        "pos": torch.zeros(shape, dtype=torch.long, device=device),
        "doc": torch.zeros(shape, dtype=torch.long, device=device),
        "win_acts": torch.zeros(*shape, width, device=device),
        "win_tokens": torch.full((*shape, width), -1, dtype=torch.int32, device=device),
    }
