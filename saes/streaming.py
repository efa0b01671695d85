"""The streaming loop shared by caching, streamed summaries and streamed evals: corpus
blocks -> this rank's batches -> skip what a resume says is done -> one capturing forward
per batch.

The corpus is packed into blocks (`saes.corpus.iter_blocks`) and read in the same order by
every rank, to its end, so a corpus too short for the requested blocks is the same clear
error on every rank. The model runs only on this rank's own batches, once per batch for
all hooks (`saes.forward.run_hooks`, stopped after the deepest), and the activations come
back on the model's device with the batch's blocks and the positions statistics leave out.

Ranks under `torchrun` split the batches one of two ways: contiguous, near-equal shares
(`saes.distributed.rank_share`; summaries and evals), or shards of `shard_batches`
consecutive batches dealt round-robin (`saes.distributed.rank_shards`; the cache, whose
shard `k` is written by rank `k mod R`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.distributed import DistContext, rank_and_world, rank_shards, rank_share
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.store.activations import Blocks, excluded_positions


def separator_ids(tokenizer: Any) -> list[int]:
    """BOS / EOS / padding ids: positions left out of training and metrics."""
    ids = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return sorted({i for i in ids if i is not None})


def special_ids(handle: ModelHandle) -> list[int]:
    """The model's special token ids (BOS, EOS, padding): positions left out of training,
    summaries, evals and, unless asked for, text search."""
    return sorted({*separator_ids(handle.tokenizer), *([handle.bos_token_id] if handle.bos_token_id is not None else [])})


def whole_blocks(n_tokens: int, corpus: CorpusSpec) -> int:
    """How many whole blocks of `corpus.context_size` tokens `n_tokens` holds
    (InvalidInputError when not even one)."""
    n_blocks = n_tokens // corpus.context_size
    if n_blocks < 1:
        raise InvalidInputError(f"n_tokens={n_tokens} is less than one block of {corpus.context_size}")
    return n_blocks


@dataclass(frozen=True)
class StreamedBatch:
    """One batch of corpus blocks and the activations of the streamed hooks on it."""

    first_block: int  # corpus index of the batch's first block
    token_ids: torch.Tensor  # [n, T] int64, on the CPU
    doc_ids: torch.Tensor  # [n, T] int64, on the CPU
    excluded: torch.Tensor  # [n, T] bool, on the CPU: BOS and separator positions
    acts: dict[str, torch.Tensor]  # hook -> [n, T, d], on the model's device

    def blocks(self, hook: str) -> Blocks:
        """The batch as `Blocks` of `hook` (what `ActivationReader.blocks` gives for a cache)."""
        n, T = self.token_ids.shape
        return Blocks(self.acts[hook], self.token_ids, torch.arange(T).expand(n, T), self.doc_ids,
                      torch.arange(self.first_block, self.first_block + n), self.excluded)


def stream_activations(
    handle: ModelHandle,
    corpus: CorpusSpec,
    hooks: Iterable[str],
    *,
    n_blocks: int,
    batch_blocks: int,
    shard_batches: int | None = None,
    resume_blocks: int = 0,
    desc: str = "streaming",
    progress: bool = True,
    ctx: DistContext | None = None,
) -> Iterator[StreamedBatch]:
    """Run `handle` over the first `n_blocks` blocks of `corpus`, `batch_blocks` at a time,
    and yield this rank's batches with the activations of `hooks`.

    The ranks of `ctx` take contiguous shares of the batches, or with `shard_batches` the
    shards of that many batches round-robin. This rank's first `resume_blocks` blocks (done
    by an earlier run) are skipped without a forward. A progress bar (`desc`) counts this
    rank's tokens. InvalidInputError when the corpus has fewer than `n_blocks` blocks.
    """
    needed = sorted(set(hooks), key=handle.hook_layer)
    n_batches = -(-n_blocks // batch_blocks)
    own = rank_share(n_batches, ctx) if shard_batches is None else rank_shards(n_batches, shard_batches, ctx)
    mine = set(own)
    own_blocks = sum(min(batch_blocks, n_blocks - number * batch_blocks) for number in own)
    rank, world = rank_and_world(ctx)
    special = special_ids(handle)
    seen = reached = 0
    bar = tqdm(total=own_blocks * corpus.context_size, initial=min(resume_blocks, own_blocks) * corpus.context_size,
               unit="tok", unit_scale=True, desc=desc if world == 1 else f"{desc} (rank {rank})",
               disable=not progress)
    try:
        for number, batch in enumerate(iter_blocks(handle.tokenizer, corpus, max_blocks=n_blocks,
                                                   batch_blocks=batch_blocks)):
            n, T = batch.token_ids.shape
            seen += n
            if number not in mine:
                continue  # another rank's batch
            reached += n
            if reached <= resume_blocks:
                continue  # done before the resume
            excluded = excluded_positions(batch.token_ids, torch.arange(T).expand(n, T),
                                          prepend_bos=corpus.prepend_bos, special_ids=special)
            yield StreamedBatch(number * batch_blocks, batch.token_ids, batch.doc_ids, excluded,
                                run_hooks(handle, batch.token_ids, needed))
            bar.update(n * T)
    finally:
        bar.close()
    if seen < n_blocks:
        raise InvalidInputError(
            f"corpus {corpus.source!r} gave only {seen} blocks of {corpus.context_size} tokens; "
            f"{n_blocks} were requested (ask for at most {seen * corpus.context_size} tokens)"
        )
