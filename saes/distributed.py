"""The engine layer of `distributed`; its other layers: `sae_atlas.saes.train.distributed`
(training).

torch.distributed under torchrun: the process group, this rank's place in it, reductions
and the deterministic split of work between ranks.

Every multi-process command (train, cache, summarize, eval) is launched with
`torchrun --nproc_per_node=R [--nnodes ...] -m sae_atlas ...` and joins the group here. The
backend is gloo on CPU and nccl when CUDA is available; without WORLD_SIZE > 1 there is
no group and every helper acts as the single process it is.
"""

from __future__ import annotations

import atexit
import os
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
        """The device this rank runs on: its own GPU under nccl, else `requested`."""
        if requested.startswith("cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return requested


def init_distributed(backend: str | None = None) -> DistContext | None:
    """Join the torchrun process group (None when not launched with WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if chosen == "nccl":
            torch.cuda.set_device(local_rank)  # object collectives use the current device
        dist.init_process_group(backend=chosen)
        atexit.register(_leave_group)
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank)


def _leave_group() -> None:
    """Tear the process group down before the interpreter does: a gloo group left to
    static destruction at exit can abort the process ("terminate called without an
    active exception") after its work has finished."""
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_and_world(ctx: DistContext | None) -> tuple[int, int]:
    """`(rank, world_size)`, `(0, 1)` without a process group."""
    return (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)


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


def rank_share(n_items: int, ctx: DistContext | None) -> range:
    """The contiguous, near-equal share of `n_items` (batches) this rank takes, in rank
    order (all of them without a process group)."""
    rank, world = rank_and_world(ctx)
    per, extra = divmod(n_items, world)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (1 if rank < extra else 0))


def rank_shards(n_items: int, shard_size: int, ctx: DistContext | None) -> list[int]:
    """The items (batches) of the shards this rank takes, in order: shard `k` (items
    `k * shard_size` to `(k + 1) * shard_size - 1`) goes to rank `k mod R` (all of them
    without a process group)."""
    rank, world = rank_and_world(ctx)
    return [item for item in range(n_items) if (item // shard_size) % world == rank]
