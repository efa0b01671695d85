"""One streamed forward over a corpus with every requested layer's `hook_resid_post`
captured, accumulating what the depth analysis needs in bounded memory:

- a seeded uniform subsample of token states `[M, L, D]` (random keys, the `max_points`
  smallest kept in preallocated arrays: `saes.depth.reservoir`), for intrinsic dimension,
  local dimension and trajectories;
- debiased linear CKA sums between every pair of layers over all tokens (`geometry.cka`);
- the tuned lens's normal equations over the fitting split (the first `fit_fraction` of the
  batches), then logit- and tuned-lens scores over the held-out batches that follow.

BOS and separator positions are left out everywhere.

Resumable: with a `state_dir`, every `checkpoint_every` batches (by default every
`checkpoint_seconds` or ten times the last write's duration, whichever is longer, so writing
stays under a tenth of the time: the state holds the CKA sums, 1.2 GB for 30 layers of 576;
and right after the tuned lens is fitted) a rank writes everything it has gathered, atomically, to `<state_dir>/<fingerprint of the arguments>/rank-NNNN.pt`; after
kill -9 the same call skips the batches already counted and ends with the same sums, so the
same tables. The caller removes the folder (`clear_state`) once the run is stored.

Under torchrun the ranks take contiguous shares of the batches. CKA sums and the subsample
merge exactly (a token's subsample key depends only on the seed and its block, so the kept
tokens are those of one process); the tuned lens is fitted on the first `fit_fraction` of
each rank's batches, its sums added across ranks before any rank scores, so the lens
scores depend on the number of ranks through that split.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.cka import CKAAccumulator
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.depth.lens import (
    LensScores,
    TunedLens,
    TunedLensFitter,
    next_token_rows,
    score_lenses,
)
from sae_atlas.saes.depth.reservoir import Reservoir
from sae_atlas.saes.distributed import DistContext, all_reduce_, rank_and_world
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.streaming import StreamedBatch, stream_activations, whole_blocks
from sae_atlas.store.atomic import atomic_path


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


CONTEXT = 12  # token ids kept with each subsampled token: it and the ones before it in its block
STATE_FORMAT = 2  # of the checkpointed `_Gathered`: part of the checkpoint folder's fingerprint


@dataclass
class DepthStream:
    """What one streamed pass gathered."""

    layers: list[int]
    states: np.ndarray  # [M, L, D] float32: the subsampled tokens' states at `layers`
    block: np.ndarray  # [M] corpus block of each subsampled token
    position: np.ndarray  # [M] position in its block
    doc: np.ndarray  # [M] document id
    token: np.ndarray  # [M] token id
    context: np.ndarray  # [M, CONTEXT] ids of the block's tokens ending at each one (-1 before the block start)
    n_tokens: int  # tokens seen (special positions left out)
    cka: CKAAccumulator
    lens: LensScores
    tuned: TunedLens


@dataclass
class _Gathered:
    """What a rank has gathered so far (the checkpointed state)."""

    sample: Reservoir  # columns: states [L, D], block, position, doc, token, context [CONTEXT]
    done: int = 0  # this rank's batches counted
    seen: int = 0
    cka: CKAAccumulator = field(default_factory=CKAAccumulator)
    fitter: TunedLensFitter = field(default_factory=TunedLensFitter)
    tuned: TunedLens | None = None
    scores: LensScores = field(default_factory=LensScores)


def _sample(capacity: int, n_layers: int, d_model: int) -> Reservoir:
    """The empty token subsample: each token's states at every layer and where it stands."""
    return Reservoir(capacity, [((n_layers, d_model), np.float32), *(((), np.int64),) * 4, ((CONTEXT,), np.int64)])


def state_folder(state_dir: str | Path, handle: ModelHandle, arguments: dict[str, object]) -> Path:
    """The checkpoint folder of one depth stream: `state_dir` / a fingerprint of the model
    and every argument that changes what is gathered."""
    text = json.dumps([STATE_FORMAT, handle.spec, arguments], sort_keys=True, default=str)
    return Path(state_dir) / hashlib.sha256(text.encode()).hexdigest()[:16]


def clear_state(folder: Path | None) -> None:
    """Remove a finished stream's checkpoint folder (and the parent when left empty)."""
    if folder is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    if folder.parent.is_dir() and not any(folder.parent.iterdir()):
        folder.parent.rmdir()


def _load_state(path: Path | None, fresh: _Gathered, ctx: DistContext | None, device: torch.device) -> _Gathered:
    """This rank's checkpoint, or `fresh`; under torchrun every rank starts over unless all
    ranks stand on the same side of the tuned lens's fit (the fit sums across ranks)."""
    got = torch.load(path, weights_only=False) if path is not None and path.exists() else fresh
    if ctx is not None and ctx.world_size > 1:
        fitted = int(all_reduce_(torch.tensor(int(got.tuned is not None), device=device), ctx))
        if 0 < fitted < ctx.world_size:
            return fresh
    return got


def _save_state(path: Path | None, state: _Gathered) -> None:
    if path is None:
        return
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def stream_depth(
    handle: ModelHandle, corpus: CorpusSpec, layers: list[int], *, n_tokens: int, batch_blocks: int = 8,
    max_points: int = 4000, fit_fraction: float = 0.25, seed: int = 0, progress: bool = True,
    ctx: DistContext | None = None, state: Path | None = None, checkpoint_every: int | None = None,
    checkpoint_seconds: float = 60.0,
) -> DepthStream:
    """Stream `n_tokens` corpus tokens once through `handle`, capturing the residual stream
    after every layer of `layers` (and the last layer, whose logits the lenses score
    against); see the module docstring for what is kept. `state`: the checkpoint folder
    (`state_folder`) to resume from and write to; None keeps nothing on disk."""
    layers = check_layers(handle, layers)
    last = handle.n_layers - 1
    n_blocks = whole_blocks(n_tokens, corpus)
    rank, world = rank_and_world(ctx)
    n_batches = -(-n_blocks // batch_blocks) // world  # the smallest rank share: the same check on every rank
    n_fit = int(round(fit_fraction * n_batches))
    if not 0 < n_fit < n_batches:
        raise InvalidInputError(f"{n_tokens} tokens make {n_batches} batches of {batch_blocks} blocks"
                                f"{f' per rank of {world}' if world > 1 else ''}; the tuned lens needs at least one "
                                f"batch to fit on and one held out (fit_fraction={fit_fraction}): give more tokens "
                                f"or a smaller --batch-blocks")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise InvalidInputError(f"checkpoint_every must be at least 1, got {checkpoint_every}")
    hooks = {layer: f"blocks.{layer}.hook_resid_post" for layer in sorted({*layers, last})}
    path = None if state is None else state / f"rank-{rank:04d}.pt"
    fresh = _Gathered(_sample(min(max_points, n_blocks * corpus.context_size), len(layers), handle.d_model))
    g = _load_state(path, fresh, ctx, handle.device)
    last_saved, save_cost = time.monotonic(), 0.0
    for batch in stream_activations(handle, corpus, list(hooks.values()), n_blocks=n_blocks,
                                    batch_blocks=batch_blocks, resume_blocks=g.done * batch_blocks, desc="depth",
                                    progress=progress, ctx=ctx):
        _gather(handle, batch, hooks, layers, g, seed)
        lens_rows, next_ids = next_token_rows({layer: batch.acts[hook].float() for layer, hook in hooks.items()},
                                              batch.token_ids, batch.excluded)
        fitted_now = False
        if g.done < n_fit:
            g.fitter.update(lens_rows, lens_rows[last])
        else:
            if g.tuned is None:
                _sum_fitter(g.fitter, ctx, handle.device)
                g.tuned, fitted_now = g.fitter.fit(), True
                g.fitter = TunedLensFitter()  # its sums are spent: not checkpointed again
            score_lenses(handle, lens_rows, next_ids, g.scores, g.tuned)
        g.done += 1
        due = (g.done % checkpoint_every == 0 if checkpoint_every is not None
               else time.monotonic() - last_saved >= max(checkpoint_seconds, 10 * save_cost))
        if due or fitted_now:
            started = time.monotonic()
            _save_state(path, g)
            last_saved = time.monotonic()
            save_cost = last_saved - started
    assert g.tuned is not None  # every rank has n_fit < n_batches batches, so it scored held-out ones
    scores, seen, cka = g.scores, g.seen, g.cka
    keys, kept = g.sample.rows()
    for key in [key for key in scores.n if key[1] not in layers]:  # the last layer scored only as the reference
        for table in (scores.n, scores.agree, scores.kl, scores.ranks):
            table.pop(key)
    if ctx is not None and ctx.world_size > 1:
        _sum_cka(cka, ctx, handle.device)
        seen = int(all_reduce_(torch.tensor(seen, device=handle.device), ctx))
        gathered: list[tuple[LensScores, np.ndarray, list[np.ndarray]]] = [None] * ctx.world_size  # type: ignore[list-item]
        dist.all_gather_object(gathered, (scores, keys, kept))
        scores = LensScores()
        for other, _, _ in gathered:
            scores.merge(other)
        keys = np.concatenate([g[1] for g in gathered])
        kept = [np.concatenate([g[2][i] for g in gathered]) for i in range(len(kept))]
        top = np.argpartition(keys, max_points)[:max_points] if len(keys) > max_points else np.arange(len(keys))
        kept = [k[top] for k in kept]
    order = np.lexsort((kept[2], kept[1]))  # by block, then position: the same for any number of ranks
    kept = [k[order] for k in kept]
    return DepthStream(layers, kept[0], *kept[1:], n_tokens=seen, cka=cka, lens=scores, tuned=g.tuned)


def _gather(handle: ModelHandle, batch: StreamedBatch, hooks: dict[int, str], layers: list[int], g: _Gathered,
            seed: int) -> None:
    """Add one batch's non-special tokens to the CKA sums and offer them to the seeded
    subsample of `g` (only the tokens that enter it are copied there)."""
    keep = ~batch.excluded
    rows = {layer: batch.acts[hooks[layer]].float()[keep.to(handle.device)].cpu() for layer in layers}
    n = int(keep.sum())
    g.seen += n
    g.cka.update(rows)
    T = keep.shape[1]
    where = keep.flatten().nonzero()[:, 0]  # flat [row * T + position] of each kept token, in order
    padded = torch.cat([torch.full((len(keep), CONTEXT - 1), -1, dtype=batch.token_ids.dtype), batch.token_ids], 1)
    windows = padded.unfold(1, CONTEXT, 1)  # [n, T, CONTEXT]: the CONTEXT ids ending at each position

    def entering(index: np.ndarray) -> list[np.ndarray]:
        i = torch.from_numpy(index)
        row, position = where[i] // T, where[i] % T
        return [torch.stack([rows[layer][i] for layer in layers], 1).numpy(), (batch.first_block + row).numpy(),
                position.numpy(), batch.doc_ids[row, position].numpy(), batch.token_ids[row, position].numpy(),
                windows[row, position].numpy()]

    g.sample.offer(np.random.default_rng([seed, batch.first_block]).random(n), entering)


def _summed(arr: np.ndarray, ctx: DistContext | None, device: torch.device) -> np.ndarray:
    return all_reduce_(torch.as_tensor(np.asarray(arr, dtype=np.float64)).to(device), ctx).cpu().numpy()


def _sum_fitter(fitter: TunedLensFitter, ctx: DistContext | None, device: torch.device) -> None:
    """Add the tuned-lens sums of every rank (in place; a no-op in one process)."""
    if ctx is None or ctx.world_size == 1:
        return
    for layer in sorted(fitter.zz):
        fitter.zz[layer] = torch.from_numpy(_summed(fitter.zz[layer].numpy(), ctx, device))
        fitter.zy[layer] = torch.from_numpy(_summed(fitter.zy[layer].numpy(), ctx, device))
    fitter.y_sum = torch.from_numpy(_summed(fitter.y_sum.numpy(), ctx, device))
    fitter.yy, fitter.n = float(_summed(np.array(fitter.yy), ctx, device)), int(_summed(np.array(fitter.n), ctx, device))


def _sum_cka(cka: CKAAccumulator, ctx: DistContext, device: torch.device) -> None:
    """Add the CKA sums of every rank (in place): exact, as `CKAAccumulator.merge`."""
    cka.map_sums(lambda arr: _summed(arr, ctx, device))
