"""The engine layer of `cache`; its other layers: `sae_atlas.api.commands.cache` (CLI).

Caching residual-stream activations: one forward pass per batch for all hooks.

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
The corpus, the rank split, the resume and the forwards are `saes.streaming`'s loop.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext, all_reduce_, barrier, rank_and_world
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.streaming import separator_ids, stream_activations, whole_blocks
from sae_atlas.store.activations import ActivationWriter
from sae_atlas.store.atomic import atomic_write_bytes
from sae_atlas.store.dtypes import parse_dtype
from sae_atlas.store.layout import AtlasLayout


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


def _check_model_matches(layout: AtlasLayout, spec: Any) -> None:
    if layout.atlas_json.exists():
        cached = layout.read_meta().get("model")
        if cached is not None and cached != spec:
            raise InvalidInputError(
                f"{layout.atlas_json} belongs to model {cached!r}, not {spec!r}; "
                "use another atlas directory"
            )


class _UndoOnInputError:
    """Puts an atlas back as it was when a cache run fails on a user error (an empty or too
    short corpus, another amount of tokens) before it wrote a shard: the atlas directory,
    `activations/` and hook folders the run created are removed and atlas.json is restored.
    Only in one process: under torchrun the other ranks may still be writing."""

    def __init__(self, layout: AtlasLayout, hooks: list[str], ctx: DistContext | None) -> None:
        self.layout, self.ctx = layout, ctx
        created = [layout.root, layout.root / "activations", *(layout.activation_dir(h) for h in hooks)]
        self.absent = [path for path in created if not path.exists()]  # outermost first
        self.meta = layout.atlas_json.read_bytes() if layout.atlas_json.exists() else None
        self.started: list[tuple[ActivationWriter, int]] = []

    def watch(self, writers: Iterable[ActivationWriter]) -> None:
        """Remember how far `writers` were before this run wrote anything."""
        self.started = [(writer, writer.n_blocks_done) for writer in writers]

    def __enter__(self) -> _UndoOnInputError:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        wrote = any(writer.n_blocks_done != blocks for writer, blocks in self.started)
        if isinstance(error, InvalidInputError) and self.ctx is None and not wrote:
            self._restore()

    def _restore(self) -> None:
        for path in self.absent:
            shutil.rmtree(path, ignore_errors=True)
        atlas_json = self.layout.atlas_json
        if not self.layout.root.exists():
            return
        if self.meta is None:
            atlas_json.unlink(missing_ok=True)
        elif atlas_json.read_bytes() != self.meta:
            atomic_write_bytes(atlas_json, self.meta)


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

    Re-running after an interruption resumes; re-running a finished cache does nothing. A
    run (in one process) refused for its input before it wrote a shard, e.g. for an empty
    corpus, leaves the atlas directory as it found it.
    """
    if not hooks:
        raise InvalidInputError("no hooks requested")
    for hook in hooks:
        handle.check_hook(hook)
    parse_dtype(dtype, kind="activation dtype")
    target_blocks = whole_blocks(n_tokens, corpus)
    shard_blocks = -(-shard_blocks // batch_blocks) * batch_blocks  # shards end on batch ends
    layout = AtlasLayout(atlas)
    _check_model_matches(layout, handle.spec)
    rank, world = rank_and_world(ctx)
    with _UndoOnInputError(layout, hooks, ctx) as undo:
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
                hooks=sorted(set(layout.recorded_hooks()) | set(hooks)),
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
                "use another atlas directory to cache a different amount"
            )
        pending = {hook: writer for hook, writer in writers.items() if not writer.complete}
        if not pending:
            return dataclasses.replace(summary, already_complete=True)
        resume = min(w.n_blocks_done for w in pending.values())
        for writer in pending.values():
            if writer.n_blocks_done != resume:
                writer.truncate_to(resume)
        undo.watch(pending.values())
        computed = 0
        for batch in stream_activations(handle, corpus, pending, n_blocks=target_blocks, batch_blocks=batch_blocks,
                                        shard_batches=shard_blocks // batch_blocks, resume_blocks=resume,
                                        desc="caching", progress=progress, ctx=ctx):
            for hook, writer in pending.items():
                writer.append(batch.acts[hook], batch.token_ids, batch.doc_ids)
            computed += len(batch.token_ids)
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
