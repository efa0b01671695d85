"""How training splits work between torchrun ranks (the process group itself lives in
`saes.distributed`).

Two modes, both launched with `torchrun --nproc_per_node=N`:
- data-parallel (DDP) for one SAE: every rank reads the same global batch stream and
  trains on its own contiguous slice of each batch; gradients are averaged by
  `DistributedDataParallel`, dead-latent counts are summed, so the run equals a
  single-process run on the global batches;
- per-layer: the hooks are dealt round-robin to the ranks and each rank trains its SAEs
  alone with the single-process trainer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sae_atlas.saes.distributed import DistContext


def assign_hooks(hooks: Sequence[str], ctx: DistContext | None) -> list[str]:
    """The hooks this rank trains in per-layer mode (round-robin over ranks)."""
    if ctx is None:
        return list(hooks)
    return list(hooks[ctx.rank :: ctx.world_size])


def rank_slice(batch_BD: torch.Tensor, ctx: DistContext | None) -> torch.Tensor:
    """This rank's contiguous share of a global batch (the whole batch without DDP)."""
    if ctx is None or ctx.world_size == 1:
        return batch_BD
    per_rank = batch_BD.shape[0] // ctx.world_size
    return batch_BD[ctx.rank * per_rank : (ctx.rank + 1) * per_rank]
