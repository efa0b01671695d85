"""Caching residual-stream activations: one forward pass per batch for all hooks.

The model runs only up to the deepest hooked layer. Every hook's writer flushes shards
at the same block counts, and shard boundaries fall on batch boundaries, so a run that
was killed resumes from the last shard all hooks have verified and produces exactly the
bytes an uninterrupted run would.

Under `torchrun --nproc_per_node=R` the ranks split the shards: shard `k` (blocks
`k * shard_blocks` to `(k + 1) * shard_blocks - 1`) is computed and written by rank
`k mod R`. Every rank reads the corpus in the same order and runs the model only on its
own shards' batches, so each shard holds the same blocks, byte for byte, whatever R is.
Each rank records and resumes its own shards; once all have finished, rank 0 merges the
records into the hook's manifest.json. The atlas must be on a file system all ranks share.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from saes.corpus import CorpusSpec, iter_blocks
from saes.distributed import DistContext, all_reduce_, barrier, rank_and_world
from saes.hook_fns import capture_hooks
from saes.models import ModelHandle
from store.activations import ActivationWriter
from store.dtypes import parse_dtype
from store.errors import InvalidInputError
from store.layout import AtlasLayout


@dataclass
class CacheSummary:
    """What a cache run produced (printed by the CLI)."""

    atlas: str
    model: str
    hooks: list[str]
    n_blocks: int
    n_tokens: int
    n_shards: int
    resumed_from_blocks: int
    seconds: float
    tokens_per_second: float
    already_complete: bool


def separator_ids(tokenizer: Any) -> list[int]:
    """BOS / EOS / padding ids: positions left out of training and metrics."""
    ids = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return sorted({i for i in ids if i is not None})


def _check_model_matches(layout: AtlasLayout, spec: Any) -> None:
    if layout.atlas_json.exists():
        cached = layout.read_meta().get("model")
        if cached is not None and cached != spec:
            raise InvalidInputError(
                f"{layout.atlas_json} belongs to model {cached!r}, not {spec!r}; "
                "use another --atlas directory"
            )


def run_hooks(handle: ModelHandle, tokens: torch.Tensor, hooks: list[str]) -> dict[str, torch.Tensor]:
    """Activations `[batch, pos, d]` of `hooks` from one forward pass stopped after the deepest
    (on the model's device; `tokens` are moved there)."""
    stop = max(handle.hook_layer(h) for h in hooks) + 1
    captured: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        handle.bridge.run_with_hooks(
            tokens.to(handle.device), fwd_hooks=capture_hooks(hooks, captured), stop_at_layer=max(stop, 1)
        )
    missing = [h for h in hooks if h not in captured]
    if missing:
        raise InvalidInputError(f"hooks {missing} did not fire before layer {stop}")
    return captured


def cache_activations(
    handle: ModelHandle,
    atlas: str | Path,
    hooks: list[str],
    *,
    corpus: CorpusSpec,
    n_tokens: int,
    dtype: str = "float32",
    batch_blocks: int = 8,
    shard_blocks: int = 64,
    progress: bool = True,
    ctx: DistContext | None = None,
) -> CacheSummary:
    """Cache `hooks` of `handle` over `n_tokens` tokens of `corpus` into the atlas at `atlas`
    (as one rank of `ctx`, writing its share of the shards, when given).

    Re-running after an interruption resumes; re-running a finished cache does nothing.
    """
    if not hooks:
        raise InvalidInputError("no hooks requested")
    for hook in hooks:
        handle.check_hook(hook)
    parse_dtype(dtype, kind="activation dtype")
    target_blocks = n_tokens // corpus.context_size
    if target_blocks < 1:
        raise InvalidInputError(f"n_tokens={n_tokens} is less than one block of {corpus.context_size}")
    shard_blocks = -(-shard_blocks // batch_blocks) * batch_blocks  # shards end on batch ends
    layout = AtlasLayout(atlas)
    _check_model_matches(layout, handle.spec)
    rank, world = rank_and_world(ctx)
    writers = {
        hook: ActivationWriter(
            atlas,
            hook,
            d=handle.d_model,
            dtype=dtype,
            model=handle.name,
            context_size=corpus.context_size,
            bos_token_id=handle.bos_token_id,
            prepend_bos=corpus.prepend_bos,
            shard_blocks=shard_blocks,
            special_token_ids=separator_ids(handle.tokenizer),
            extra={"corpus": dataclasses.asdict(corpus), "target_blocks": target_blocks},
            rank=rank,
            world_size=world,
            total_blocks=target_blocks,
        )
        for hook in hooks
    }
    if rank == 0:
        layout.update_meta(
            model=handle.spec,
            model_name=handle.name,
            n_layers=handle.n_layers,
            d_model=handle.d_model,
            corpus=dataclasses.asdict(corpus),
            hooks=sorted(set(layout.read_meta().get("hooks", []) if layout.atlas_json.exists() else []) | set(hooks)),
        )
    start = time.perf_counter()
    summary = CacheSummary(atlas=str(layout.root), model=handle.name, hooks=list(writers), n_blocks=target_blocks,
                           n_tokens=target_blocks * corpus.context_size,
                           n_shards=-(-target_blocks // shard_blocks) * len(writers), resumed_from_blocks=0,
                           seconds=0.0, tokens_per_second=0.0, already_complete=False)
    done = {w.n_blocks_done for w in writers.values() if w.complete}
    if done - {target_blocks}:
        raise InvalidInputError(
            f"hooks are already cached with {sorted(done)} blocks, not {target_blocks}; "
            "use another --atlas directory to cache a different amount"
        )
    pending = {hook: writer for hook, writer in writers.items() if not writer.complete}
    if not pending:
        return dataclasses.replace(summary, already_complete=True)
    resume = min(w.n_blocks_done for w in pending.values())
    for writer in pending.values():
        if writer.n_blocks_done != resume:
            writer.truncate_to(resume)
    own_blocks = sum(min(shard_blocks, target_blocks - k * shard_blocks)
                     for k in range(rank, -(-target_blocks // shard_blocks), world))
    seen = own = computed = 0
    bar = tqdm(total=own_blocks * corpus.context_size, initial=resume * corpus.context_size,
               unit="tok", unit_scale=True, desc="caching" if world == 1 else f"caching (rank {rank})",
               disable=not progress)
    for number, batch in enumerate(iter_blocks(handle.tokenizer, corpus, max_blocks=target_blocks,
                                               batch_blocks=batch_blocks)):
        n = len(batch.token_ids)
        seen += n
        if (number * batch_blocks // shard_blocks) % world != rank:
            continue  # another rank's shard
        own += n
        if own <= resume:
            continue
        acts = run_hooks(handle, batch.token_ids, list(pending))
        for hook, writer in pending.items():
            writer.append(acts[hook], batch.token_ids, batch.doc_ids)
        computed += n
        bar.update(n * corpus.context_size)
    bar.close()
    if seen < target_blocks:
        raise InvalidInputError(
            f"corpus {corpus.source!r} gave only {seen} blocks of {corpus.context_size} tokens; "
            f"{target_blocks} were requested (ask for at most {seen * corpus.context_size} tokens)"
        )
    for writer in pending.values():
        writer.finish()
    barrier(ctx)
    if ctx is not None and ctx.is_main:
        for writer in pending.values():
            writer.merge_ranks()
    barrier(ctx)
    seconds = time.perf_counter() - start
    totals = all_reduce_(torch.tensor([resume, computed], device=handle.device), ctx)
    return dataclasses.replace(summary, resumed_from_blocks=int(totals[0]), seconds=seconds,
                               tokens_per_second=float(totals[1]) * corpus.context_size / seconds)
