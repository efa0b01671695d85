"""Where the training loop's batches come from: the `ActivationSource` protocol, and its
cached implementations (an atlas's activation caches, or any stream of row tensors).

A source hands out one batch per optimizer step as `{hook: [rows, d_hook] float32}`; rows
of different hooks at the same index are the same token (a transcoder pairs its input and
output hook, a CLT takes every layer's pair, a crosscoder two hooks). Under torchrun each
rank receives its own share of every global batch of `batch_size` tokens: rank r's
`batch_size // world` contiguous rows, so the ranks' shares concatenated in rank order are
the global batch a single process gets. `state_dict` is enough to continue exactly after a
resume; an exhausted source raises InvalidInputError naming how many batches it gave.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.train.distributed import rank_slice
from sae_atlas.store.activations import ActivationReader, Split

Batch = dict[str, torch.Tensor]  # hook -> [rows, d_hook]
# Rows as the single-dictionary trainers took them: an iterable of tensors, or a function
# `skip -> iterator` starting after `skip` batches (e.g. `lambda s: reader.batches(B, skip_batches=s)`).
RowStream = Iterable[torch.Tensor] | Callable[[int], Iterator[torch.Tensor]]


@runtime_checkable
class ActivationSource(Protocol):
    """One batch per step for every dictionary of a run (see module doc)."""

    hooks: tuple[str, ...]  # the hooks every batch carries
    batch_size: int  # tokens per global batch (all ranks together)

    def next_batch(self) -> Batch:
        """This rank's share of the next global batch, `{hook: [batch_size // world, d_hook]}`."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Enough to continue exactly where the source stands (after `load_state_dict`)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()` taken earlier (possibly by another process)."""
        ...


def ran_out(given: int, batch_size: int, needed: str = "") -> InvalidInputError:
    """The error of a source that gave `given` batches and has no more."""
    return InvalidInputError(f"the batch source ran out after {given} batches of {batch_size} tokens"
                             + (f"; the run needs {needed}" if needed else ""))


def _cached_state(state: dict[str, Any]) -> int:
    """The batches given of a cached source's state; InvalidInputError for a streamed one."""
    if state.get("source") == "stream":
        raise InvalidInputError(
            "the checkpoint was written by a training run streamed from the model; one run does not mix cached "
            "and streamed sources: finish it with `sae-atlas train --from-model` or delete its checkpoints/ folder")
    return int(state["batches"])


def _whole(batch: torch.Tensor, batch_size: int) -> torch.Tensor:
    """A global batch, checked to hold `batch_size` rows."""
    if batch.shape[0] != batch_size:
        raise InvalidInputError(f"expected batches of {batch_size} rows, got shape {tuple(batch.shape)}")
    return batch


class RowSource:
    """A stream of row tensors (`RowStream`, every rank the same global batches of `shape`)
    as a source: `split` turns one global batch of rows into `{hook: rows}` (e.g. an SAE's
    rows are its one hook; a transcoder's `[B, d_in + d_out]` rows are its two hooks). Its
    state is the number of batches given; resuming reopens the stream after that many (a
    callable is asked for the stream after `skip` batches, an iterable is re-iterated and
    skipped)."""

    def __init__(self, rows: RowStream, split: Callable[[torch.Tensor], Batch], hooks: tuple[str, ...],
                 shape: tuple[int, ...], ctx: DistContext | None = None, needed: str = "") -> None:
        self.rows, self.split, self.hooks, self.shape, self.ctx = rows, split, hooks, shape, ctx
        self.batch_size = shape[0]
        self.needed = needed  # how many batches the run needs, for the ran-out error
        self.given = 0
        self._stream = self._open(0)

    def _open(self, skip: int) -> Iterator[torch.Tensor]:
        if callable(self.rows):
            return iter(self.rows(skip))
        return itertools.islice(iter(self.rows), skip, None)

    def next_batch(self) -> Batch:
        rows = next(self._stream, None)
        if rows is None:
            raise ran_out(self.given, self.batch_size, self.needed)
        self.given += 1
        if tuple(rows.shape) != self.shape:
            raise InvalidInputError(f"expected batches of shape {self.shape}, got {tuple(rows.shape)}")
        return {hook: rank_slice(part, self.ctx) for hook, part in self.split(rows).items()}

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.given}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.given = _cached_state(state)
        self._stream = self._open(self.given)


class CachedSource:
    """Seeded shuffled batches of an atlas's cached hooks (`ActivationReader.batches` with
    the same seed and options for every hook, so caches written by one `sae-atlas cache` run
    give the same tokens at the same rows; a hook read alone gives exactly the batches a
    single-hook run reads). Every rank reads the global batch and keeps its share."""

    def __init__(self, readers: Mapping[str, ActivationReader], batch_size: int, *, seed: int = 0,
                 split: Split = "train", repeat: bool = True, ctx: DistContext | None = None,
                 needed: str = "") -> None:
        if not readers:
            raise InvalidInputError("a cached source needs at least one hook")
        self.readers, self.batch_size, self.ctx, self.needed = dict(readers), batch_size, ctx, needed
        self.options: dict[str, Any] = {"seed": seed, "split": split, "repeat": repeat}
        self.hooks = tuple(self.readers)
        self.given = 0
        self._streams = self._open(0)

    def _open(self, skip: int) -> dict[str, Iterator[torch.Tensor]]:
        return {hook: reader.batches(self.batch_size, skip_batches=skip, **self.options)
                for hook, reader in self.readers.items()}

    def next_batch(self) -> Batch:
        parts = {hook: next(stream, None) for hook, stream in self._streams.items()}
        if any(part is None for part in parts.values()):
            raise ran_out(self.given, self.batch_size, self.needed)
        self.given += 1
        return {hook: rank_slice(_whole(part, self.batch_size), self.ctx)
                for hook, part in parts.items() if part is not None}

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.given}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.given = _cached_state(state)
        self._streams = self._open(self.given)
