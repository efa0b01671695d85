"""Summarize an SAE over its hook's held-out cached tokens and write the feature tables.

One streaming pass over the held-out blocks encodes each batch with the SAE and feeds a
`SummaryAccumulator` (bounded state) and the on-disk occurrence spool; logit effects
come from the decoder and an unembedding passed in as tensors. Restart policy: a
summary is one pass over the held-out split (cheap next to caching and training), so an
interrupted run starts again; a completed one whose tables verify and whose parameters
match is skipped unless `force=True`, so re-running over many SAEs resumes per SAE.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from sae_atlas.errors import AtlasError, InvalidInputError
from sae_atlas.saes.atlas_saes import atlas_sae_hook, load_atlas_sae
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.labels import auto_labels
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.summary.accumulator import SummaryAccumulator, SummaryParams
from sae_atlas.saes.summary.batch import BatchInfo
from sae_atlas.saes.summary.logits import NormKind, logit_effects, split_piece_ids, vocab_strings
from sae_atlas.saes.summary.token_text import whole_characters
from sae_atlas.store.activations import ActivationReader, Blocks
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import OccurrenceWriter, read_sidecar, read_table, write_tables

SPLIT = "heldout"


@dataclass
class SummaryReport:
    """What one `summarize_sae` call did (printed by the CLI)."""

    sae_id: str
    hook: str
    n_tokens: int
    n_latents: int
    n_dead: int
    n_examples: int
    logit_effects: bool
    seconds: float
    tokens_per_second: float
    skipped: bool


def block_batches(blocks: Iterable[Blocks], batch_blocks: int) -> Iterator[Blocks]:
    """Split each shard's blocks into batches of at most `batch_blocks` whole blocks."""
    for shard in blocks:
        for start in range(0, len(shard.block_index), batch_blocks):
            sl = slice(start, start + batch_blocks)
            yield Blocks(shard.acts[sl], shard.token_ids[sl], shard.positions[sl], shard.doc_ids[sl],
                         shard.block_index[sl], shard.is_bos[sl])


def _take_tokens(chunk: Blocks, needed: int | None) -> Blocks:
    """The leading blocks of `chunk` that reach `needed` non-BOS tokens (all if None)."""
    if needed is None:
        return chunk
    cum = (~chunk.is_bos).sum(1).cumsum(0)
    n = min(int(torch.searchsorted(cum, torch.tensor(needed))) + 1, len(cum))
    return Blocks(chunk.acts[:n], chunk.token_ids[:n], chunk.positions[:n], chunk.doc_ids[:n],
                  chunk.block_index[:n], chunk.is_bos[:n])


def summarize_blocks(
    sae: SAE,
    blocks: Iterable[Blocks],
    params: SummaryParams,
    *,
    n_tokens: int | None = None,
    batch_tokens: int = 4096,
    occurrence: OccurrenceWriter | None = None,
    progress: bool = False,
    total_tokens: int | None = None,
) -> SummaryAccumulator:
    """Stream whole blocks through `sae` into a new accumulator (and `occurrence`), stopping
    after `n_tokens` non-BOS tokens (rounded up to whole blocks)."""
    acc = SummaryAccumulator(sae.cfg.d_sae, params, next(sae.parameters()).device)
    bar = tqdm(total=n_tokens or total_tokens, unit="tok", desc="summarize", disable=not progress)
    with torch.no_grad():
        for raw in blocks:
            for chunk in block_batches([raw], max(1, batch_tokens // raw.acts.shape[1])):
                chunk = _take_tokens(chunk, None if n_tokens is None else n_tokens - acc.n_tokens)
                bar.update(summarize_chunk(sae, acc, chunk, occurrence))
                if n_tokens is not None and acc.n_tokens >= n_tokens:
                    bar.close()
                    return acc
    bar.close()
    return acc


def summarize_chunk(sae: SAE, acc: SummaryAccumulator, chunk: Blocks, occurrence: OccurrenceSink | None) -> int:
    """Encode one batch of whole blocks with `sae` into `acc` (and its per-block firing
    counts into `occurrence`); return the number of non-BOS tokens added."""
    param = next(sae.parameters())
    n, T, D = chunk.acts.shape
    with torch.no_grad():
        f = sae_codes(sae, chunk.acts.reshape(n * T, D)).float()
    info = BatchInfo(
        token_ids=chunk.token_ids.reshape(-1).to(param.device),
        block=chunk.block_index[:, None].expand(n, T).reshape(-1).to(param.device),
        pos=chunk.positions.reshape(-1).to(param.device),
        doc=chunk.doc_ids.reshape(-1).to(param.device),
        valid=~chunk.is_bos.reshape(-1).to(param.device),
        context=T,
    )
    before = acc.n_tokens
    entries = acc.update(f, info)
    if occurrence is not None:
        cell = torch.div(entries.t, T, rounding_mode="floor") * f.shape[1] + entries.latent
        fired = torch.bincount(cell, minlength=n * f.shape[1]).reshape(n, -1)
        occurrence.append(chunk.block_index.cpu().numpy(), fired.cpu().numpy())
    return acc.n_tokens - before


class OccurrenceSink(Protocol):
    """Where per-block firing counts go (`store.tables.OccurrenceWriter` or a resumable spool)."""

    def append(self, block_index: np.ndarray, counts_nF: np.ndarray) -> None: ...  # noqa: N803


def existing_summary(root: str | Path, sae_id: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The sidecar of a completed summary with these parameters whose files verify, else None."""
    try:
        sidecar = read_sidecar(root, sae_id)
        if {key: sidecar["params"].get(key) for key in params} != params:
            return None
        for name in ("features.parquet", "examples.parquet"):
            read_table(root, sae_id, name, sidecar)
    except AtlasError:
        return None
    return sidecar


def summarize_sae(
    atlas_root: str | Path,
    sae_id: str,
    *,
    sae: SAE | None = None,
    W_U: torch.Tensor | None = None,  # noqa: N803 (TransformerLens name)
    final_norm_weight: torch.Tensor | None = None,
    norm_kind: NormKind = "rms",
    tokenizer: Any = None,
    n_tokens: int | None = None,
    top_k: int = 20,
    window: tuple[int, int] = (16, 4),
    n_bands: int = 6,
    per_band: int = 4,
    seed: int = 0,
    batch_tokens: int = 4096,
    progress: bool = True,
    force: bool = False,
) -> SummaryReport:
    """Summarize SAE `sae_id` of an atlas over its hook's held-out tokens and write
    `features.parquet`, `examples.parquet`, `occurrence.npz` and `tables.json`.

    The SAE is loaded from the atlas unless given. `W_U [d_in, d_vocab]` (with the final
    norm's weight and kind 'rms' / 'layer' / 'none') adds logit effects; `tokenizer` adds
    token strings. `n_tokens` caps the held-out tokens used (default: all); `window` is
    (tokens before, tokens after) the centre of each example.
    """
    started = time.perf_counter()
    root = Path(atlas_root)
    AtlasLayout(root).require_sae(sae_id)  # an unknown id fails before any work
    if sae is None:
        sae = load_atlas_sae(root, sae_id)
    hook = sae.cfg.hook_name or atlas_sae_hook(root, sae_id)
    sae.eval()
    reader = ActivationReader(root, hook)
    if reader.d != sae.cfg.d_in:
        raise InvalidInputError(f"SAE {sae_id!r} has d_in={sae.cfg.d_in} but hook {hook!r} has d={reader.d}")
    if n_tokens is not None and n_tokens <= 0:
        raise InvalidInputError(f"n_tokens must be positive, got {n_tokens}")
    summary = SummaryParams(top_k=top_k, window_before=window[0], window_after=window[1],
                            n_bands=n_bands, per_band=per_band, seed=seed)
    record = summary_record(sae, hook, summary, {"split": SPLIT, "requested_tokens": n_tokens}, W_U, norm_kind)
    use_logits = record["logit_effects"] is not None
    done = None if force else existing_summary(root, sae_id, record)
    if done is not None:
        files = done["files"]
        return SummaryReport(sae_id, hook, done["params"]["n_tokens"], files["features.parquet"]["rows"],
                             done["params"]["n_dead"], files["examples.parquet"]["rows"], use_logits,
                             time.perf_counter() - started, 0.0, True)
    occurrence = OccurrenceWriter(root, sae_id, sae.cfg.d_sae)
    try:
        acc = summarize_blocks(sae, reader.blocks(SPLIT), summary, n_tokens=n_tokens,
                               batch_tokens=batch_tokens, occurrence=occurrence, progress=progress,
                               total_tokens=reader.count_tokens(SPLIT))
        occurrence.finish()
    finally:
        occurrence.close()
    if acc.n_tokens == 0:
        raise InvalidInputError(f"the held-out split of hook {hook!r} has no non-BOS tokens")
    return write_summary(root, sae_id, sae, acc, record, started, W_U=W_U if use_logits else None,
                         final_norm_weight=final_norm_weight, norm_kind=norm_kind, tokenizer=tokenizer)


def summary_record(sae: SAE, hook: str, params: SummaryParams, source: dict[str, Any],
                   W_U: torch.Tensor | None, norm_kind: NormKind) -> dict[str, Any]:  # noqa: N803
    """The parameters recorded in tables.json (compared to skip a finished summary)."""
    use_logits = W_U is not None and W_U.shape[0] == sae.cfg.output_dim  # W_dec writes the output space
    return {
        **params.to_dict(),
        "hook": hook,
        **source,
        "logit_effects": {"norm_kind": norm_kind, "d_vocab": int(W_U.shape[1])} if use_logits else None,
    }


def write_summary(
    root: Path,
    sae_id: str,
    sae: SAE,
    acc: SummaryAccumulator,
    record: dict[str, Any],
    started: float,
    *,
    W_U: torch.Tensor | None,  # noqa: N803
    final_norm_weight: torch.Tensor | None,
    norm_kind: NormKind,
    tokenizer: Any,
) -> SummaryReport:
    """Turn a finished accumulator into `features.parquet` / `examples.parquet` (the pending
    occurrence matrix must be finished) and write them with `record` in tables.json."""
    use_logits = record["logit_effects"] is not None
    vocab = None
    if tokenizer is not None:
        d_vocab = int(W_U.shape[1]) if use_logits else len(tokenizer)
        vocab = pl.Series(vocab_strings(tokenizer, d_vocab), dtype=pl.String)
    effects = None
    if use_logits:
        effects = logit_effects(sae.W_dec, W_U, final_norm_weight=final_norm_weight, norm_kind=norm_kind,
                                n=acc.params.n_logits)
    features = acc.features_frame(sae.W_dec.norm(dim=1), effects, vocab)
    examples = acc.examples_frame(vocab)
    if tokenizer is not None:
        examples = whole_characters(examples, tokenizer, split_piece_ids(tokenizer, d_vocab))
    n_dead = int((features["n_active"] == 0).sum())
    record = {**record, "n_tokens": acc.n_tokens, "n_dead": n_dead}
    write_tables(root, sae_id, features, examples, record, labels=auto_labels(features, examples))
    seconds = time.perf_counter() - started
    return SummaryReport(sae_id, record["hook"], acc.n_tokens, features.height, n_dead, examples.height, use_logits,
                         seconds, acc.n_tokens / max(seconds, 1e-9), False)
