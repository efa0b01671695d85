"""Feature summaries streamed from model forwards: no residual cache, bounded memory, resumable.

The corpus is packed into blocks exactly as `sae-atlas cache` packs it, and each batch
runs one forward for all hooks (`saes.streaming.stream_activations`, stopped after the
deepest). Each
SAE's batch goes through the same `summarize_chunk` as a cached summary, so on the same
tokens (and batch size) the tables equal those of summarizing a cache of them with
`split="all"`.

Memory is flat in the number of tokens: the accumulators are fixed-size and the
per-block occurrence counts are spooled to disk. Every `checkpoint_every` batches (by
default: every `checkpoint_seconds`) a rank
writes its spool chunk and then, atomically, its accumulator state; after kill -9 the
next run with the same arguments skips the batches already counted and carries on.

Under `torchrun` the ranks take contiguous, near-equal shares of the batches (the corpus
is read identically by all, the model runs only on a rank's own share), the accumulator
states are gathered to rank 0 with `torch.distributed.gather_object` and merged exactly
(`accumulator_state.merge_into`), and rank 0 assembles the occurrence matrix from the
ranks' spools in block order. The atlas must be on a file system all ranks share.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import atlas_sae_hook, load_atlas_sae
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext, barrier, rank_and_world
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.streaming import stream_activations, whole_blocks
from sae_atlas.saes.summary.accumulator import SummaryAccumulator, SummaryParams
from sae_atlas.saes.summary.accumulator_state import (
    accumulator_state,
    merge_into,
    restore_accumulator,
)
from sae_atlas.saes.summary.run import (
    SummaryReport,
    existing_summary,
    summarize_chunk,
    summary_record,
    write_summary,
)
from sae_atlas.store.atomic import atomic_path
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import OccurrenceWriter

STATE_DIR = "summary-stream"


class OccurrenceSpool:
    """Per-block firing counts of one SAE, buffered and written as numbered chunk files."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder, self.name = folder, name
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []

    def append(self, block_index: np.ndarray, counts_nF: np.ndarray) -> None:  # noqa: N803
        self._parts.append((np.asarray(block_index, dtype=np.int64), counts_nF.astype(np.int32)))

    def chunk_path(self, chunk: int) -> Path:
        return self.folder / f"{self.name}-{chunk:06d}.npz"

    def flush(self, chunk: int) -> None:
        """Write what was appended since the last flush as chunk number `chunk` (atomically)."""
        blocks = np.concatenate([p[0] for p in self._parts]) if self._parts else np.zeros(0, np.int64)
        counts = np.concatenate([p[1] for p in self._parts]) if self._parts else np.zeros((0, 0), np.int32)
        rows, cols = np.nonzero(counts)
        with atomic_path(self.chunk_path(chunk)) as tmp, open(tmp, "wb") as handle:
            np.savez(handle, blocks=blocks, rows=rows, cols=cols, data=counts[rows, cols], n=len(blocks))
        self._parts = []

    def drop_from(self, chunk: int) -> None:
        """Remove chunk files numbered `chunk` or later (written after the last checkpoint)."""
        for path in self.folder.glob(f"{self.name}-*.npz"):
            if int(path.stem.rsplit("-", 1)[1]) >= chunk:
                path.unlink()

    def replay(self, n_chunks: int, into: OccurrenceWriter, d_sae: int) -> None:
        """Append chunks `0..n_chunks-1` to an occurrence writer, in order."""
        for chunk in range(n_chunks):
            with np.load(self.chunk_path(chunk)) as part:
                dense = np.zeros((int(part["n"]), d_sae), dtype=np.int32)
                dense[part["rows"], part["cols"]] = part["data"]
                into.append(part["blocks"], dense)


def _spool_name(ids: list[str], sae_id: str, rank: int) -> str:
    return f"occ-{ids.index(sae_id):03d}-rank-{rank:04d}"


def _fingerprint(handle: ModelHandle, records: dict[str, dict[str, Any]], world: int) -> str:
    text = json.dumps([handle.spec, records, world], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _save_state(path: Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def summarize_from_model(
    handle: ModelHandle,
    atlas_root: str | Path,
    sae_ids: list[str] | None = None,
    *,
    corpus: CorpusSpec,
    n_tokens: int,
    params: SummaryParams | None = None,
    batch_blocks: int = 8,
    checkpoint_every: int | None = None,
    checkpoint_seconds: float = 60.0,
    with_logits: bool = True,
    progress: bool = True,
    force: bool = False,
    ctx: DistContext | None = None,
) -> list[SummaryReport]:
    """Summarize SAEs of an atlas (default: all) over the first `n_tokens` tokens (whole
    blocks of `corpus.context_size`) of `corpus` run through `handle`, and write their
    tables. SAEs run on the model's device. A finished summary with the same arguments is
    skipped unless `force`; an interrupted one resumes from its last checkpoint."""
    started = time.perf_counter()
    params = params or SummaryParams()
    layout = AtlasLayout(atlas_root)
    ids = list(sae_ids or layout.sae_ids())
    if not ids:
        raise InvalidInputError(f"{layout.root} has no SAEs yet; train one with `sae-atlas train`")
    if (checkpoint_every is not None and checkpoint_every < 1) or batch_blocks < 1:
        raise InvalidInputError("checkpoint_every and batch_blocks must be at least 1")
    n_blocks = whole_blocks(n_tokens, corpus)
    hooks = {sae_id: handle.check_hook(atlas_sae_hook(layout.root, sae_id)) for sae_id in ids}
    W_U = handle.W_U.detach().float() if with_logits else None  # noqa: N806
    source = {"split": "stream", "corpus": dataclasses.asdict(corpus), "requested_tokens": n_blocks * corpus.context_size,
              "batch_blocks": batch_blocks}
    saes: dict[str, SAE] = {}
    records: dict[str, dict[str, Any]] = {}
    for sae_id in ids:
        sae = load_atlas_sae(layout.root, sae_id, device=handle.device)
        if sae.cfg.d_in != handle.d_model:
            raise InvalidInputError(f"SAE {sae_id!r} has d_in={sae.cfg.d_in} but {handle.name} has d_model={handle.d_model}")
        records[sae_id] = summary_record(sae, hooks[sae_id], params, source, W_U, handle.final_norm_kind)
        if force or existing_summary(layout.root, sae_id, records[sae_id]) is None:
            saes[sae_id] = sae
    if not saes:
        return [_skipped(layout.root, sae_id, hooks[sae_id]) for sae_id in ids]

    rank, world = rank_and_world(ctx)
    folder = layout.root / STATE_DIR / _fingerprint(handle, records, world)
    folder.mkdir(parents=True, exist_ok=True)
    state_path = folder / f"rank-{rank:04d}.pt"
    state = torch.load(state_path, weights_only=False) if state_path.exists() else {"done": 0, "chunks": 0, "acc": {}}
    accs = {sae_id: restore_accumulator(state["acc"][sae_id], params, handle.device) if sae_id in state["acc"]
            else SummaryAccumulator(sae.cfg.d_sae, params, handle.device) for sae_id, sae in saes.items()}
    spools = {sae_id: OccurrenceSpool(folder, _spool_name(ids, sae_id, rank)) for sae_id in saes}
    for spool in spools.values():
        spool.drop_from(state["chunks"])

    last = {"time": time.monotonic(), "done": state["done"]}

    def checkpoint() -> None:
        last.update(time=time.monotonic(), done=state["done"])
        for spool in spools.values():
            spool.flush(state["chunks"])
        state["chunks"] += 1
        state["acc"] = {sae_id: accumulator_state(acc) for sae_id, acc in accs.items()}
        _save_state(state_path, state)

    batches = stream_activations(handle, corpus, [hooks[sae_id] for sae_id in saes], n_blocks=n_blocks,
                                 batch_blocks=batch_blocks, resume_blocks=state["done"] * batch_blocks,
                                 desc="summarize (model)", progress=progress, ctx=ctx)
    for batch in batches:
        for sae_id, sae in saes.items():
            summarize_chunk(sae, accs[sae_id], batch.blocks(hooks[sae_id]), spools[sae_id])
        state["done"] += 1
        due = (state["done"] % checkpoint_every == 0 if checkpoint_every is not None
               else time.monotonic() - last["time"] >= checkpoint_seconds)
        if due:
            checkpoint()
    if state["done"] > last["done"] or state["done"] == 0:
        checkpoint()
    reports = _finish(layout.root, folder, handle, ids, saes, records, state, accs, W_U, started, ctx)
    return reports + [_skipped(layout.root, sae_id, hooks[sae_id]) for sae_id in ids if sae_id not in saes]


def _gather_chunks(n_chunks: int, ctx: DistContext | None) -> list[int]:
    """Every rank's number of spool chunks, in rank order."""
    if ctx is None:
        return [n_chunks]
    counts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(counts, n_chunks)
    return [int(c) for c in counts]


def _finish(root: Path, folder: Path, handle: ModelHandle, ids: list[str], saes: dict[str, SAE], records: dict[str, dict[str, Any]],
            state: dict[str, Any], accs: dict[str, SummaryAccumulator], W_U: torch.Tensor | None,  # noqa: N803
            started: float, ctx: DistContext | None) -> list[SummaryReport]:
    """Merge the ranks' accumulators on rank 0 and write every SAE's tables there."""
    chunks = _gather_chunks(state["chunks"], ctx)
    norm = handle.final_norm_weight
    reports = []
    for sae_id, sae in saes.items():
        acc = accs[sae_id]
        if ctx is not None:
            gathered: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
            dist.gather_object(accumulator_state(acc), gathered, dst=0)
            if ctx.is_main:
                acc = restore_accumulator(gathered[0], acc.params, handle.device)
                for other in gathered[1:]:
                    merge_into(acc, restore_accumulator(other, acc.params, handle.device))
        if ctx is not None and not ctx.is_main:
            continue
        if acc.n_tokens == 0:
            raise InvalidInputError(f"the streamed tokens of {records[sae_id]['hook']!r} have no non-BOS tokens")
        occurrence = OccurrenceWriter(root, sae_id, sae.cfg.d_sae)
        try:
            for rank, n_chunks in enumerate(chunks):
                OccurrenceSpool(folder, _spool_name(ids, sae_id, rank)).replay(n_chunks, occurrence, sae.cfg.d_sae)
            occurrence.finish()
        finally:
            occurrence.close()
        reports.append(write_summary(root, sae_id, sae, acc, records[sae_id], started, W_U=W_U,
                                     final_norm_weight=None if norm is None else norm.float(),
                                     norm_kind=handle.final_norm_kind,
                                     tokenizer=handle.tokenizer))
    barrier(ctx)
    if ctx is None or ctx.is_main:
        shutil.rmtree(folder, ignore_errors=True)
    return reports


def _skipped(root: Path, sae_id: str, hook: str) -> SummaryReport:
    sidecar = existing_summary(root, sae_id, {})
    params = sidecar["params"] if sidecar else {}
    files = sidecar["files"] if sidecar else {}
    return SummaryReport(sae_id, hook, params.get("n_tokens", 0), files.get("features.parquet", {}).get("rows", 0),
                         params.get("n_dead", 0), files.get("examples.parquet", {}).get("rows", 0),
                         params.get("logit_effects") is not None, 0.0, 0.0, True)
