"""One streamed forward over a corpus with every requested layer's `hook_resid_post`
captured, accumulating what the depth analysis needs in bounded memory:

- a seeded uniform subsample of token states `[M, L, D]` (random keys, the `max_points`
  smallest kept), for intrinsic dimension, local dimension and trajectories;
- debiased linear CKA sums between every pair of layers over all tokens (`geometry.cka`);
- the tuned lens's normal equations over the fitting split (the first `fit_fraction` of the
  batches), then logit- and tuned-lens scores over the held-out batches that follow.

BOS and separator positions are left out everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from geometry.cka import CKAAccumulator
from saes.corpus import CorpusSpec
from saes.depth.lens import LensScores, TunedLens, TunedLensFitter, next_token_rows, score_lenses
from saes.models import ModelHandle
from saes.streaming import stream_activations, whole_blocks
from store.errors import InvalidInputError


def check_layers(handle: ModelHandle, layers: list[int]) -> list[int]:
    """`layers` sorted and checked against the model: at least 3 distinct layers, each in
    `0..n_layers-1` (InvalidInputError naming the model's range otherwise)."""
    bad = [layer for layer in layers if not 0 <= layer < handle.n_layers]
    if bad:
        raise InvalidInputError(f"model {handle.name} has layers 0..{handle.n_layers - 1}; "
                                f"the requested layer range includes {bad}")
    chosen = sorted(set(layers))
    if len(chosen) < 3:
        raise InvalidInputError(f"the depth analysis needs at least 3 layers (trajectories turn between 2 steps); "
                                f"got {chosen}")
    return chosen


@dataclass
class DepthStream:
    """What one streamed pass gathered."""

    layers: list[int]
    states: np.ndarray  # [M, L, D] float32: the subsampled tokens' states at `layers`
    block: np.ndarray  # [M] corpus block of each subsampled token
    position: np.ndarray  # [M] position in its block
    doc: np.ndarray  # [M] document id
    token: np.ndarray  # [M] token id
    n_tokens: int  # tokens seen (special positions left out)
    cka: CKAAccumulator
    lens: LensScores
    tuned: TunedLens


def stream_depth(
    handle: ModelHandle, corpus: CorpusSpec, layers: list[int], *, n_tokens: int, batch_blocks: int = 8,
    max_points: int = 4000, fit_fraction: float = 0.25, seed: int = 0, progress: bool = True,
) -> DepthStream:
    """Stream `n_tokens` corpus tokens once through `handle`, capturing the residual stream
    after every layer of `layers` (and the last layer, whose logits the lenses score
    against); see the module docstring for what is kept."""
    layers = check_layers(handle, layers)
    last = handle.n_layers - 1
    n_blocks = whole_blocks(n_tokens, corpus)
    n_batches = -(-n_blocks // batch_blocks)
    n_fit = int(round(fit_fraction * n_batches))
    if not 0 < n_fit < n_batches:
        raise InvalidInputError(f"{n_tokens} tokens make {n_batches} batches of {batch_blocks} blocks; the tuned lens "
                                f"needs at least one batch to fit on and one held out (fit_fraction={fit_fraction}): "
                                f"give more tokens or a smaller --batch-blocks")
    hooks = {layer: f"blocks.{layer}.hook_resid_post" for layer in sorted({*layers, last})}
    rng = np.random.default_rng(seed)
    keys = np.empty(0)
    kept: list[np.ndarray] = [np.empty((0, len(layers), handle.d_model), np.float32), *(np.empty(0, np.int64),) * 4]
    cka, fitter, scores = CKAAccumulator(), TunedLensFitter(), LensScores()
    tuned: TunedLens | None = None
    seen = 0
    for number, batch in enumerate(stream_activations(handle, corpus, list(hooks.values()), n_blocks=n_blocks,
                                                      batch_blocks=batch_blocks, desc="depth", progress=progress)):
        acts = {layer: batch.acts[hook].float() for layer, hook in hooks.items()}
        keep = ~batch.excluded
        rows = {layer: acts[layer][keep.to(acts[layer].device)].cpu() for layer in layers}
        n = int(keep.sum())
        seen += n
        cka.update(rows)
        n_rows, T = keep.shape
        blocks = (batch.first_block + torch.arange(n_rows))[:, None].expand(n_rows, T)[keep]
        meta = [blocks, torch.arange(T).expand(n_rows, T)[keep], batch.doc_ids[keep], batch.token_ids[keep]]
        keys = np.concatenate([keys, rng.random(n)])
        kept = [np.concatenate([kept[0], torch.stack([rows[layer] for layer in layers], 1).numpy()]),
                *(np.concatenate([old, m.numpy()]) for old, m in zip(kept[1:], meta, strict=True))]
        if len(keys) > max_points:
            top = np.sort(np.argpartition(keys, max_points)[:max_points])
            keys, kept = keys[top], [k[top] for k in kept]
        lens_rows, next_ids = next_token_rows(acts, batch.token_ids, batch.excluded)
        if number < n_fit:
            fitter.update(lens_rows, lens_rows[last])
            continue
        if tuned is None:
            tuned = fitter.fit()
        score_lenses(handle, lens_rows, next_ids, scores, tuned)
    if tuned is None:  # unreachable: n_fit < n_batches
        raise InvalidInputError("no held-out batch reached the lens scores")
    for key in [key for key in scores.n if key[1] not in layers]:  # the last layer scored only as the reference
        for table in (scores.n, scores.agree, scores.kl, scores.ranks):
            table.pop(key)
    return DepthStream(layers, kept[0], *kept[1:], n_tokens=seen, cka=cka, lens=scores, tuned=tuned)
