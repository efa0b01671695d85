"""torch.distributed helpers: process-group setup under torchrun, reductions, hook split.

Two modes, both launched with `torchrun --nproc_per_node=N`:
- data-parallel (DDP) for one SAE: every rank reads the same global batch stream and
  trains on its own contiguous slice of each batch; gradients are averaged by
  `DistributedDataParallel`, dead-latent counts are summed, so the run equals a
  single-process run on the global batches;
- per-layer: the hooks are dealt round-robin to the ranks and each rank trains its SAEs
  alone with the single-process trainer.
The backend is gloo on CPU and nccl when CUDA is available.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    """This process's place in the process group."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str) -> str:
        """The device this rank trains on: its own GPU under nccl, else `requested`."""
        if requested.startswith("cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested


def init_distributed(backend: str | None = None) -> DistContext | None:
    """Join the torchrun process group (None when not launched with WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if not dist.is_initialized():
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend=chosen)
    return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_(tensor: torch.Tensor, ctx: DistContext | None, op: str = "sum") -> torch.Tensor:
    """In-place sum (or mean) across ranks; a no-op without a process group."""
    if ctx is not None and ctx.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        if op == "mean":
            tensor.div_(ctx.world_size)
    return tensor


def barrier(ctx: DistContext | None) -> None:
    if ctx is not None and ctx.world_size > 1:
        dist.barrier()


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
