"""A streamed `ActivationSource`: training batches straight from model forwards, no cache.

The corpus is packed into blocks as `sae-atlas cache` packs it and read in batches of
`batch_blocks` blocks; each batch runs one forward for all hooks, stopped after the deepest
(`saes.streaming.stream_activations`). Batches are grouped into windows of
`window_batches` batches (the mixing buffer, `buffer_tokens` tokens): window `g` of the
corpus belongs to lane `g mod L`, its kept token rows (BOS and special positions left out,
as the cache and summaries leave them out) are permuted by a generator seeded from
`(seed, g)` and handed out `batch_size // L` rows at a time. The rows of a window that do
not fill a last share (the tail of its permutation) carry over into the lane's next window,
which shuffles them in with its own rows, so no token is dropped but the run's last few
(less than one share per lane). A global batch is every lane's share in lane order. Under
torchrun each rank streams its own lanes (`L` is a multiple of the ranks, by default equal),
so one process with `lanes=R` trains on exactly the batches of R ranks. Rows of different
hooks at one index are one token.

A second model (`model_b`, the same tokenizer) can run on the same token ids, stopped
after its deepest requested hook; its rows join model A's in the batches under the keys
`model_b_hook(hook)` ("model_b:<hook>"), so they are mixed, handed out and resumed with A's.

Everything is a function of `(seed, corpus, position)`: a tokenizer-only pass over the
corpus (`plan_stream`, before any forward) counts the batches each window gives, so a
checkpoint needs only the number of global batches handed out (`{"batches": n}`, the same on
every rank and for any number of ranks streaming the same lanes). On resume the current window is recomputed by re-running its forwards (bit-identical
on CPU in fp32), so the buffer is never saved. The same pass checks up front that the corpus
holds the training tokens and the held-out blocks after them. The pass also counts the rows
each window carries over, so a resume at window `w` recomputes window `w - 1`'s carried tail
(one more window's forwards) and nothing earlier: a window's tail is taken from its own rows.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.distributed import DistContext, rank_and_world
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.streaming import StreamedBatch, special_ids, stream_activations
from sae_atlas.saes.train.sources import ran_out
from sae_atlas.store.activations import excluded_positions

DEFAULT_BUFFER_TOKENS = 262_144  # the cached reader's mixing buffer
DEFAULT_MEMORY_SHARE = 0.25  # the default buffer takes at most this share of free memory
MAX_MEMORY_SHARE = 0.8  # a requested buffer larger than this share of free memory is refused
MODEL_B = "model_b:"  # the prefix of model B's hooks in a streamed batch


def model_b_hook(hook: str) -> str:
    """The key of model B's `hook` in a streamed batch (beside model A's own hook names)."""
    return MODEL_B + hook


def available_memory(device: torch.device) -> int:
    """Free bytes where the buffer lives: the GPU's free memory, else the host's MemAvailable."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def buffer_bytes_per_token(handle: ModelHandle, hooks: list[str], model_b: ModelHandle | None = None) -> int:
    """Bytes one buffered token takes: every hook's row in its model's dtype (model B's
    hooks, `model_b_hook` keys, in B's)."""
    def row(model: ModelHandle) -> int:
        return next(model.bridge.parameters()).element_size() * model.d_model

    return sum(row(model_b if model_b is not None and h.startswith(MODEL_B) else handle) for h in hooks)


def resolve_buffer_tokens(requested: int | None, handle: ModelHandle, hooks: list[str], batch_size: int,
                          windows: int = 1, run_tokens: int | None = None, model_b: ModelHandle | None = None) -> int:
    """The mixing buffer's size in tokens: `requested`, or by default the cached reader's
    buffer (262,144 tokens) capped at a quarter of the free memory and at what one lane's
    share of the run needs (`run_tokens`, plus a sixteenth for the BOS and separators left
    out, so a short run forwards one window, not a whole default one), at least two batches.
    InvalidInputError when it holds less than one batch or when the `windows` this process
    holds at once (one per lane it streams) need more than 80% of the free memory."""
    per_token = buffer_bytes_per_token(handle, hooks, model_b) * windows
    free = available_memory(handle.device)
    if requested is None:
        run_cap = DEFAULT_BUFFER_TOKENS if run_tokens is None else run_tokens + run_tokens // 16
        return max(2 * batch_size, min(DEFAULT_BUFFER_TOKENS, run_cap, int(free * DEFAULT_MEMORY_SHARE) // per_token))
    if requested < batch_size:
        raise InvalidInputError(f"--buffer-tokens {requested} holds less than one batch ({batch_size} tokens)")
    if requested * per_token > free * MAX_MEMORY_SHARE:
        raise InvalidInputError(
            f"--buffer-tokens {requested} needs {requested * per_token / 2**30:.2f} GiB ({windows} window(s) x "
            f"{len(hooks)} hooks x {per_token // windows // len(hooks)} bytes per token) but only {free / 2**30:.2f} GiB are free on "
            f"{handle.device}; ask for at most {int(free * MAX_MEMORY_SHARE) // per_token} tokens")
    return requested


@dataclass(frozen=True)
class StreamPlan:
    """Where the windows and held-out blocks lie, counted by a tokenizer-only pass."""

    window_batches: int  # corpus batches (of batch_blocks blocks) per window
    n_blocks: int  # training blocks, whole windows, all lanes
    heldout_blocks: int  # blocks after the training blocks kept for held-out metrics
    per_window: tuple[tuple[int, ...], ...]  # per lane, its windows in order: the batches each hands out
    carried: tuple[tuple[int, ...], ...]  # per lane, its windows in order: the rows each carries into the next

    def locate(self, lane: int, batches: int) -> tuple[int, int]:
        """(the lane's window, batches already taken from it) after `batches` batches."""
        for window, count in enumerate(self.per_window[lane]):
            if batches < count:
                return window, batches
            batches -= count
        raise ran_out(batches, 0)


def plan_stream(handle: ModelHandle, corpus: CorpusSpec, *, steps: int, batch_size: int, batch_blocks: int,
                buffer_tokens: int, heldout_tokens: int, lanes: int) -> StreamPlan:
    """Count, from token ids alone, the batches each window gives until every lane has
    `steps` of them, plus the held-out blocks after; InvalidInputError naming the tokens the
    corpus holds when it ends first."""
    rows = batch_size // lanes
    window_batches = max(1, round(buffer_tokens / (batch_blocks * corpus.context_size)))
    special = special_ids(handle)
    counts: list[list[int]] = [[] for _ in range(lanes)]
    carried: list[list[int]] = [[] for _ in range(lanes)]
    kept = batches = blocks = 0
    heldout = -(-heldout_tokens // corpus.context_size)
    train_blocks: int | None = None
    for batch in iter_blocks(handle.tokenizer, corpus, batch_blocks=batch_blocks):
        n, T = batch.token_ids.shape
        blocks += n
        if train_blocks is not None:
            if blocks - train_blocks >= heldout:
                break
            continue
        if n < batch_blocks:
            break  # the corpus' last, partial batch ends no window
        excluded = excluded_positions(batch.token_ids, torch.arange(T).expand(n, T),
                                      prepend_bos=corpus.prepend_bos, special_ids=special)
        kept += int((~excluded).sum())
        batches += 1
        if batches % window_batches == 0:
            if kept < rows:
                raise InvalidInputError(
                    f"a window of the {buffer_tokens}-token buffer keeps only {kept} tokens (BOS and separators "
                    f"left out), less than one share of a batch ({rows} tokens); raise --buffer-tokens")
            lane = (batches // window_batches - 1) % lanes
            given = kept + (carried[lane][-1] if carried[lane] else 0)
            counts[lane].append(given // rows)
            carried[lane].append(given % rows)  # < rows <= kept: a tail of the window's own rows
            kept = 0
            if min(sum(c) for c in counts) >= steps:
                train_blocks = blocks
                if heldout == 0:
                    break
    if train_blocks is not None and blocks - train_blocks >= heldout:
        return StreamPlan(window_batches, train_blocks, heldout, tuple(tuple(c) for c in counts),
                          tuple(tuple(c) for c in carried))
    available = min(sum(c) for c in counts) * batch_size
    raise InvalidInputError(
        f"corpus {corpus.source!r} is too short: its {blocks} blocks of {corpus.context_size} tokens give "
        f"{available} training tokens in whole windows of the {buffer_tokens}-token buffer (BOS and separators "
        f"left out), then {heldout} held-out blocks are needed; {steps * batch_size} training tokens were "
        f"asked for: ask for fewer tokens, a smaller --buffer-tokens, or use a larger corpus")


class _Lane:
    """One lane's stream, its current window's rows in the order handed out, and the tail
    that window carries into the next."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.stream: Iterator[StreamedBatch] | None = None
        self.window = -1
        self.rows: dict[str, torch.Tensor] = {}
        self.tail: dict[str, torch.Tensor] = {}

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()  # type: ignore[attr-defined]
        self.stream, self.window, self.rows, self.tail = None, -1, {}, {}


class StreamSource:
    """Training batches streamed from `handle` over `corpus`, mixed in windows (see the
    module docstring). The corpus' windows are dealt round-robin to `lanes` lanes (default:
    one per rank); a global batch is `batch_size // lanes` rows of each lane, in lane order,
    and each rank streams its own lanes, so one process with `lanes=R` gets exactly the
    batches R ranks get together. `next_batch` gives this rank's share. With `model_b` the
    hooks named `model_b_hook(hook)` are `model_b`'s, run on the same token ids."""

    def __init__(self, handle: ModelHandle, corpus: CorpusSpec, hooks: list[str], *, batch_size: int,
                 steps: int, batch_blocks: int = 8, buffer_tokens: int | None = None, heldout_tokens: int = 0,
                 lanes: int | None = None, seed: int = 0, ctx: DistContext | None = None,
                 model_b: ModelHandle | None = None) -> None:
        named_b = [h.removeprefix(MODEL_B) for h in hooks if h.startswith(MODEL_B)]
        if named_b and model_b is None:
            raise InvalidInputError(f"hooks {named_b} are model B's but no model B is given")
        self.model_b = model_b
        self.hooks_a = tuple(sorted({handle.check_hook(h) for h in hooks if not h.startswith(MODEL_B)},
                                    key=handle.hook_layer))
        self.hooks_b = tuple(sorted({model_b.check_hook(h) for h in named_b}, key=model_b.hook_layer)) if model_b else ()
        if not self.hooks_a:
            raise InvalidInputError("a stream reads at least one hook of its own model (model A)")
        self.hooks = (*self.hooks_a, *map(model_b_hook, self.hooks_b))
        rank, world = rank_and_world(ctx)
        self.lanes = lanes or world
        if self.lanes % world or batch_size % self.lanes:
            raise InvalidInputError(f"the lanes ({self.lanes}) must be a multiple of the ranks ({world}) and "
                                    f"divide batch_size ({batch_size})")
        if batch_blocks < 1:
            raise InvalidInputError(f"batch_blocks must be at least 1, got {batch_blocks}")
        self.handle, self.corpus, self.ctx, self.seed = handle, corpus, ctx, seed
        self.batch_size, self.batch_blocks, self.steps = batch_size, batch_blocks, steps
        self.lane_rows = batch_size // self.lanes
        per_rank = self.lanes // world
        self._lanes = [_Lane(lane) for lane in range(rank * per_rank, (rank + 1) * per_rank)]
        self.device = handle.device
        self.buffer_tokens = resolve_buffer_tokens(buffer_tokens, handle, list(self.hooks), batch_size, per_rank,
                                                   run_tokens=steps * self.lane_rows, model_b=model_b)
        self.plan = plan_stream(handle, corpus, steps=steps, batch_size=batch_size, batch_blocks=batch_blocks,
                                buffer_tokens=self.buffer_tokens, heldout_tokens=heldout_tokens, lanes=self.lanes)
        self.batches = 0  # global batches handed out
        self.forward_seconds = 0.0  # time spent streaming (tokenizing and forwards)

    def _with_model_b(self, stream: Iterator[StreamedBatch]) -> Iterator[StreamedBatch]:
        """`stream`'s batches with model B's hooks added (`model_b_hook` keys), from B's
        forward over the same token ids, stopped after B's deepest hook."""
        if self.model_b is None:
            yield from stream
            return
        try:
            for batch in stream:
                acts_b = run_hooks(self.model_b, batch.token_ids, list(self.hooks_b))
                yield dataclasses.replace(batch, acts={**batch.acts, **{model_b_hook(h): a for h, a in acts_b.items()}})
        finally:
            stream.close()  # type: ignore[attr-defined]

    def _open(self, lane: int, window: int) -> Iterator[StreamedBatch]:
        """A lane's stream positioned at the start of its window `window`."""
        return self._with_model_b(stream_activations(
            self.handle, self.corpus, self.hooks_a, n_blocks=self.plan.n_blocks, batch_blocks=self.batch_blocks,
            shard_batches=self.plan.window_batches, resume_blocks=window * self.plan.window_batches * self.batch_blocks,
            progress=False, ctx=DistContext(lane, self.lanes, 0)))

    def _refill(self, lane: _Lane, window: int, tail_only: bool = False) -> None:
        """Stream the lane's window `window`, permute its kept rows (seeded by the seed and the
        window's corpus-wide index), keep the tail it carries into the next window, and shuffle
        the rows carried in from the previous window in with the rest (on a resume that tail
        is recomputed first from the previous window's own rows; `tail_only`: just that)."""
        carried_in = self.plan.carried[lane.index][window - 1] if window and not tail_only else 0
        if carried_in and lane.window != window - 1:
            self._refill(lane, window - 1, tail_only=True)
        if lane.stream is None or window != lane.window + 1:
            lane.close()
            lane.stream = self._open(lane.index, window)
        carried, lane.rows, lane.tail = lane.tail, {}, {}  # the old window goes before the new one streams in
        started = time.perf_counter()
        parts: dict[str, list[torch.Tensor]] = {hook: [] for hook in self.hooks}
        for _ in range(self.plan.window_batches):
            with torch.autocast(self.device.type, enabled=False):  # the model runs in its own dtype
                batch = next(lane.stream)
            keep = ~batch.excluded.reshape(-1).to(self.device)
            for hook in self.hooks:
                acts = batch.acts[hook]
                parts[hook].append(acts.reshape(-1, acts.shape[-1])[keep])
        self.forward_seconds += time.perf_counter() - started
        corpus_window = window * self.lanes + lane.index
        gen = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, corpus_window]).generate_state(1)[0]))
        own = sum(len(p) for p in parts[self.hooks[0]])
        order = torch.randperm(own, generator=gen).to(self.device)
        keep_own = own - self.plan.carried[lane.index][window]
        mixed = torch.randperm(keep_own + carried_in, generator=gen).to(self.device) if carried_in else None
        for hook in self.hooks:  # one hook at a time: the window takes at most its size plus one hook's copy
            rows = torch.cat(parts.pop(hook))[order]
            lane.tail[hook] = rows[keep_own:]
            if not tail_only:
                lane.rows[hook] = rows[:keep_own] if mixed is None else torch.cat([carried[hook], rows[:keep_own]])[mixed]
        lane.window = window

    def next_batch(self) -> dict[str, torch.Tensor]:
        """This rank's share of the next global batch (its lanes' rows in lane order), float32
        on the model's device."""
        if self.batches >= min(sum(counts) for counts in self.plan.per_window):
            raise ran_out(self.batches, self.batch_size, f"{self.steps} were planned")
        shares = []
        for lane in self._lanes:
            window, offset = self.plan.locate(lane.index, self.batches)
            if window != lane.window:
                self._refill(lane, window)
            start = offset * self.lane_rows
            shares.append({hook: rows[start:start + self.lane_rows] for hook, rows in lane.rows.items()})
        self.batches += 1
        return {hook: torch.cat([share[hook] for share in shares]).float() for hook in self.hooks}

    def heldout_batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Rows of the held-out blocks (after the training blocks), `batch_size` at a time, in
        corpus order, on one process (float32 on the model's device)."""
        if not self.plan.heldout_blocks:
            return
        stream = self._with_model_b(stream_activations(
            self.handle, self.corpus, self.hooks_a, n_blocks=self.plan.n_blocks + self.plan.heldout_blocks,
            batch_blocks=self.batch_blocks, resume_blocks=self.plan.n_blocks, progress=False))
        pending: dict[str, list[torch.Tensor]] = {hook: [] for hook in self.hooks}
        for batch in stream:
            keep = ~batch.excluded.reshape(-1).to(self.device)
            for hook in self.hooks:
                acts = batch.acts[hook]
                pending[hook].append(acts.reshape(-1, acts.shape[-1])[keep].float())
            rows = {hook: torch.cat(parts) for hook, parts in pending.items()}
            while len(rows[self.hooks[0]]) >= batch_size:
                yield {hook: r[:batch_size] for hook, r in rows.items()}
                rows = {hook: r[batch_size:] for hook, r in rows.items()}
            pending = {hook: [r] for hook, r in rows.items()}
        if pending[self.hooks[0]] and len(pending[self.hooks[0]][0]):
            yield {hook: parts[0] for hook, parts in pending.items()}

    def state_dict(self) -> dict[str, Any]:
        """The batches handed out (the same on every rank) and what the stream depends on."""
        return {"source": "stream", "batches": self.batches, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after `state["batches"]` batches; the window is recomputed on the next batch.
        InvalidInputError for the state of a cached source or of another stream."""
        if state.get("source") != "stream":
            raise InvalidInputError(
                "the checkpoint was written by a training run over cached activations; one run does not mix cached "
                "and streamed sources: finish it with `sae-atlas train` (cached) or delete its checkpoints/ folder")
        if state.get("fingerprint") != self.fingerprint():
            raise InvalidInputError(
                f"the checkpoint's stream {state.get('fingerprint')} differs from this run's {self.fingerprint()} "
                "(corpus, seed, batch size, buffer or number of ranks changed); start afresh")
        for lane in self._lanes:
            lane.close()
        self.batches = int(state["batches"])

    def fingerprint(self) -> dict[str, Any]:
        """What the streamed rows depend on (besides the model; model B's spec when there is one)."""
        return {"corpus": dataclasses.asdict(self.corpus), "hooks": list(self.hooks), "seed": self.seed,
                "batch_size": self.batch_size, "batch_blocks": self.batch_blocks,
                "window_batches": self.plan.window_batches, "lanes": self.lanes, "tails": "carried",
                **({"model_b": self.model_b.spec} if self.model_b is not None else {})}
