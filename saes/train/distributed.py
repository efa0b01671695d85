"""The training layer of `distributed`; its other layers: `sae_atlas.saes.distributed` (engine).

Each torchrun rank's share of a global batch (the process group itself lives in
`saes.distributed`; the two ways training splits work, data-parallel and module-sharded,
are described in `saes.train.loop`)."""

from __future__ import annotations

import torch

from sae_atlas.saes.distributed import DistContext


def rank_slice(batch_BD: torch.Tensor, ctx: DistContext | None) -> torch.Tensor:
    """This rank's contiguous share of a global batch (the whole batch without DDP)."""
    if ctx is None or ctx.world_size == 1:
        return batch_BD
    per_rank = batch_BD.shape[0] // ctx.world_size
    return batch_BD[ctx.rank * per_rank : (ctx.rank + 1) * per_rank]
