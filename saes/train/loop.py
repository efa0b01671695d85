"""One training loop for any number of dictionaries of any kind, fed by one batch source.

Each step takes ONE batch from the `ActivationSource` and steps every dictionary on it, so
N SAEs, transcoders, a CLT and a crosscoder train from one read of the cache (or one
forward of the model). A fresh run first draws the first `max(first_batches)` batches,
initialises every dictionary from them (scales, variance, `b_dec`) and then trains on the
same batches, as a single-dictionary run always did.

Checkpoints are one atomic file (`saes.train.checkpoint`) holding the loop step, every
rank's source state, the RNG states and every dictionary's state; a run killed at any
point (mid-step, mid-write) resumes from the newest valid one to the same final weights.
A checkpoint taken while the first batches are still being replayed stores the source
state from before them and how many were used, so a resume draws them again.

Under torchrun (`ctx`), two ways to split the work:
- `distribute="data"`: every rank steps every dictionary on its own share of each global
  batch and DistributedDataParallel averages the gradients; firing counts are summed and
  logged metrics averaged over ranks. For losses that are means over tokens (TopK,
  JumpReLU, L1 SAEs and transcoders, CLTs) two ranks equal one process up to float
  rounding: the mean of two half-batch gradients is not summed in the same order as one
  full-batch gradient (about 1e-7 relative per step in fp32), and Adam and the decoder
  renormalisation carry such differences on, so weights agree to ~1e-5 (the tests' atol)
  after short runs, not bit for bit. Two terms are statistics of the batch itself and
  are computed on each rank's share: the AuxK loss's normaliser (the residual's variance)
  and BatchTopK's selection (hence crosscoders); with them a data-parallel run is a
  valid but different estimator, so use module sharding where equality matters.
- `distribute="modules"`: each rank owns the dictionaries `dictionaries[rank::world]` and
  trains them alone; the ranks' shares of each batch are all-gathered first, so every
  dictionary sees the whole global batch, in the same row order, as in one process. Each
  rank's arithmetic is then the single-process arithmetic: the weights are identical to a
  one-process run on CPU (bit for bit in fp32 on the same machine). More ranks than
  dictionaries are refused by name before training.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.train.checkpoint import (
    load_latest_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from sae_atlas.saes.train.dictionary import Dictionary
from sae_atlas.saes.train.sources import ActivationSource, Batch

Distribute = Literal["data", "modules"]
DISTRIBUTE: tuple[Distribute, ...] = get_args(Distribute)
# Called after every step with the loop step and this rank's dictionaries' metrics by name.
OnStep = Callable[[int, dict[str, dict[str, float]]], None]


@dataclass
class LoopRun:
    """What the loop leaves: this rank's dictionaries (all under data-parallel), whether
    they reached their last step, the step a resume started from, and the wall time (from
    before the first batches are drawn, so a streamed run's first forwards count)."""

    dictionaries: list[Dictionary]
    finished: bool
    resumed_from_step: int | None
    wall_seconds: float


def _world(ctx: DistContext | None) -> int:
    return 1 if ctx is None else ctx.world_size


def check_run(dictionaries: Sequence[Dictionary], source: ActivationSource, ctx: DistContext | None,
              distribute: Distribute) -> None:
    """InvalidInputError, before any training, for a run that cannot go: no dictionaries,
    repeated names, hooks the source lacks, dictionaries that disagree with the source on
    the batch size or with each other on the steps, a batch the ranks cannot split, module
    sharding over more ranks than dictionaries."""
    if not dictionaries:
        raise InvalidInputError("nothing to train: no dictionaries given")
    if distribute not in DISTRIBUTE:
        raise InvalidInputError(f"distribute must be one of {', '.join(DISTRIBUTE)}, got {distribute!r}")
    names = [d.name for d in dictionaries]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"dictionary names repeat in one run: {sorted(n for n in set(names) if names.count(n) > 1)}")
    for d in dictionaries:
        if missing := [h for h in d.hooks if h not in source.hooks]:
            raise InvalidInputError(f"dictionary {d.name!r} reads hooks {missing} the batch source does not give "
                                    f"(it gives {', '.join(source.hooks)})")
        if d.train.batch_size != source.batch_size:
            raise InvalidInputError(f"dictionary {d.name!r} trains on batches of {d.train.batch_size} tokens but the "
                                    f"source gives {source.batch_size}")
    if len(steps := {d.train.total_steps for d in dictionaries}) > 1:
        raise InvalidInputError(f"the dictionaries of one run must train for the same steps, got {sorted(steps)}")
    world = _world(ctx)
    if source.batch_size % world:
        raise InvalidInputError(f"batch_size {source.batch_size} must be divisible by the number of ranks ({world})")
    if distribute == "modules" and world > len(dictionaries):
        raise InvalidInputError(f"--distribute-modules over {world} ranks needs at least {world} dictionaries, got "
                                f"{len(dictionaries)} ({', '.join(names)}); use fewer ranks or data-parallel training")


def _gather(batch: Batch, ctx: DistContext | None, device: str) -> Batch:
    """The global batch from every rank's share (rank order; gathered on `device`, which
    nccl needs); the batch itself alone."""
    if _world(ctx) == 1:
        return batch
    out = {}
    for hook, part in batch.items():
        part = part.to(device).contiguous()
        parts = [torch.empty_like(part) for _ in range(_world(ctx))]
        dist.all_gather(parts, part)
        out[hook] = torch.cat(parts)
    return out


def _gather_objects(obj: Any, ctx: DistContext | None) -> list[Any]:
    """Every rank's `obj` in rank order (rank 0's list is complete; others get [])."""
    if _world(ctx) == 1:
        return [obj]
    assert ctx is not None
    out: list[Any] = [None] * ctx.world_size if ctx.is_main else []
    dist.gather_object(obj, out if ctx.is_main else None, dst=0)
    return out


class _Loop:
    """The state of one run of the loop over this rank's dictionaries."""

    def __init__(self, everyone: Sequence[Dictionary], source: ActivationSource, ctx: DistContext | None,
                 distribute: Distribute, checkpoint_dir: Path | None) -> None:
        self.source, self.ctx, self.distribute, self.checkpoint_dir = source, ctx, distribute, checkpoint_dir
        rank, world = (0, 1) if ctx is None else (ctx.rank, ctx.world_size)
        self.mine = list(everyone[rank::world]) if distribute == "modules" else list(everyone)
        for d in self.mine:
            d.distribute(ctx if distribute == "data" else None)
        self.train, self.device = everyone[0].train, everyone[0].device
        self.total = self.train.total_steps
        self.step = 0
        self.replay: dict[str, Any] | None = None  # {"state", "count"} while the first batches replay
        self.pending: list[Batch] = []

    def _draw(self, n: int) -> list[Batch]:
        return [self.source.next_batch() for _ in range(n)]

    def start(self) -> int | None:
        """Resume from the newest checkpoint (returning its step) or initialise from the first batches."""
        state = load_latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir is not None else None
        if state is not None:
            self._load(state)
            return self.step
        before = self.source.state_dict()
        first = self._draw(max(d.first_batches() for d in self.mine))
        whole = [_gather(b, self.ctx, self.device) for b in first]  # initialisation sees whole global batches
        for d in self.mine:
            d.initialise(whole[: d.first_batches()])
        self.replay, self.pending = {"state": before, "count": len(first)}, first
        return None

    def _load(self, state: dict[str, Any]) -> None:
        if "dictionaries" not in state:
            raise InvalidInputError(f"the checkpoint in {self.checkpoint_dir} was written by an earlier version of the "
                                    "trainer; delete its checkpoints/ folder to train afresh")
        saved, world = state["dictionaries"], _world(self.ctx)
        if missing := [d.name for d in self.mine if d.name not in saved]:
            raise InvalidInputError(
                f"the checkpoint in {self.checkpoint_dir} belongs to another run (of {', '.join(sorted(saved))}; "
                f"not of {', '.join(missing)}); finish that run or delete its checkpoints/ folder")
        if len(state["sources"]) != world:
            raise InvalidInputError(f"the checkpoint in {self.checkpoint_dir} was written by a run over "
                                    f"{len(state['sources'])} ranks; resume it over as many (now {world})")
        for d in self.mine:
            d.load(saved[d.name])
        rank = 0 if self.ctx is None else self.ctx.rank
        self.step, self.replay = state["step"], state["replay"]
        set_rng_state(state["rng"])
        self.source.load_state_dict(state["sources"][rank] if self.replay is None else self.replay["state"][rank])
        if self.replay is not None:
            self.replay = {**self.replay, "state": self.replay["state"][rank]}
            self.pending = self._draw(self.replay["count"])[self.step:]

    def next_batch(self) -> Batch:
        batch = self.pending.pop(0) if self.pending else self.source.next_batch()
        if not self.pending:
            self.replay = None
        return _gather(batch, self.ctx, self.device) if self.distribute == "modules" else batch

    def checkpoint(self) -> None:
        """One atomic checkpoint of the run (rank 0 writes what every rank holds)."""
        if self.checkpoint_dir is None:
            return
        sources = _gather_objects(self.source.state_dict(), self.ctx)
        replayed = _gather_objects(self.replay["state"], self.ctx) if self.replay is not None else None
        mine = {d.name: d.state() for d in self.mine}
        held = _gather_objects(mine, self.ctx) if self.distribute == "modules" else [mine]
        if self.ctx is not None and not self.ctx.is_main:
            return
        states = {name: s for part in held for name, s in part.items()}
        replay = None if replayed is None else {"state": replayed, "count": self.replay["count"]}  # type: ignore[index]
        save_checkpoint(self.checkpoint_dir, self.step, {"step": self.step, "sources": sources, "replay": replay,
                                                         "rng": rng_state(), "dictionaries": states})


def train_dictionaries(
    dictionaries: Sequence[Dictionary],
    source: ActivationSource,
    *,
    checkpoint_dir: str | Path | None = None,
    ctx: DistContext | None = None,
    distribute: Distribute = "data",
    stop_after_steps: int | None = None,
    on_step: OnStep | None = None,
    desc: str = "train",
) -> LoopRun:
    """Train every dictionary on the batches of `source` (see module doc) until their last
    step (or `stop_after_steps`, checkpointing there first). With `checkpoint_dir` the run
    checkpoints into its `checkpoints/` every `checkpoint_every_tokens` of the first
    dictionary's config and resumes from it; finishing (folding, saving, removing the
    checkpoints) is the caller's, per kind. `on_step` replaces the default progress bar."""
    check_run(dictionaries, source, ctx, distribute)
    loop = _Loop(dictionaries, source, ctx, distribute, Path(checkpoint_dir) if checkpoint_dir is not None else None)
    started = time.perf_counter()  # the first batches' draw counts (a streamed run's first window of forwards)
    resumed = loop.start()
    last = loop.total if stop_after_steps is None else min(loop.total, stop_after_steps)
    every, batch_size = loop.train.checkpoint_every_tokens, loop.train.batch_size
    main = ctx is None or ctx.is_main
    bar = tqdm(total=loop.total, initial=loop.step, unit="step", desc=desc,
               disable=on_step is not None or not (loop.train.progress and main))
    for d in loop.mine:
        d.module.train()
    while loop.step < last:
        batch = loop.next_batch()
        rows = {d.name: d.train_step(batch) for d in loop.mine}
        loop.step += 1
        for d in loop.mine:
            d.log(rows[d.name])
        if on_step is not None:
            on_step(loop.step, rows)
        else:
            bar.update(1)
            bar.set_postfix(_postfix(rows))
        tokens = loop.step * batch_size
        crossed = every and tokens // every > (tokens - batch_size) // every
        if loop.step < loop.total and (crossed or loop.step == last):
            loop.checkpoint()
    bar.close()
    return LoopRun(loop.mine, loop.step == loop.total, resumed, time.perf_counter() - started)


def _postfix(rows: dict[str, dict[str, float]]) -> dict[str, str]:
    """L0 and FVU of the step (one dictionary), or their means over the dictionaries."""
    values = list(rows.values())
    return {name: f"{sum(r[key] for r in values) / len(values):{fmt}}"
            for key, name, fmt in (("l0", "L0", ".1f"), ("fvu", "FVU", ".3f")) if all(key in r for r in values)}
