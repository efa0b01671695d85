"""Paired activations of two SAEs' hooks at the same tokens, streamed from the model(s).

- Same tokenizer (one model, or two models sharing a vocabulary): the corpus is packed into
  blocks once (`saes.streaming.stream_activations`, which also splits the batches between
  torchrun ranks); model A's forward captures A's hook (and B's when both SAEs read the same
  model), model B runs on the same token ids. BOS and separator positions are left out.
- Different tokenizers: the corpus documents are read as texts (each cut to what fits
  `context_size` tokens of A), tokenized by both sides, and paired at the positions
  `saes.compare.align` pairs (tokens ending at the same character). Ranks take documents
  round-robin. InvalidInputError when no text aligns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.align import align_spans, token_spans
from sae_atlas.saes.corpus import CorpusSpec, iter_documents
from sae_atlas.saes.distributed import DistContext, rank_and_world
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.streaming import stream_activations, whole_blocks


@dataclass(frozen=True)
class Side:
    """One side of a comparison: the model and the hook its SAE reads."""

    handle: ModelHandle
    hook: str


class PairedActs(NamedTuple):
    """`N` tokens' activations at both hooks (rows paired), on each model's device."""

    a_ND: torch.Tensor
    b_ND: torch.Tensor


def same_tokenizer(a: ModelHandle, b: ModelHandle) -> bool:
    """Whether both models read text with the same vocabulary (same token -> id map)."""
    return a is b or a.tokenizer.get_vocab() == b.tokenizer.get_vocab()


HookActs = dict[str, torch.Tensor]  # hook -> [N, d] rows of one side


def _same_tokens(a: ModelHandle, hooks_a: list[str], b: ModelHandle, hooks_b: list[str], corpus: CorpusSpec,
                 n_tokens: int, batch_blocks: int, ctx: DistContext | None, progress: bool
                 ) -> Iterator[tuple[HookActs, HookActs]]:
    shared = a is b
    hooks = list(dict.fromkeys([*hooks_a, *hooks_b])) if shared else hooks_a
    for batch in stream_activations(a, corpus, hooks, n_blocks=whole_blocks(n_tokens, corpus),
                                    batch_blocks=batch_blocks, desc="comparing", progress=progress, ctx=ctx):
        acts_b = batch.acts if shared else run_hooks(b, batch.token_ids, hooks_b)
        keep = ~batch.excluded.reshape(-1)
        yield _rows(batch.acts, hooks_a, keep), _rows(acts_b, hooks_b, keep)


def _rows(acts: HookActs, hooks: list[str], keep: torch.Tensor) -> HookActs:
    """`[n, T, d]` activations of `hooks` flattened to the kept token rows."""
    return {h: acts[h].reshape(-1, acts[h].shape[-1])[keep.to(acts[h].device)] for h in hooks}


def _with_bos(handle: ModelHandle, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    bos = handle.bos_token_id
    return (torch.cat([torch.tensor([bos]), ids]), 1) if bos is not None else (ids, 0)


def _aligned_texts(a: ModelHandle, hooks_a: list[str], b: ModelHandle, hooks_b: list[str], corpus: CorpusSpec,
                   n_tokens: int, ctx: DistContext | None) -> Iterator[tuple[HookActs, HookActs]]:
    rank, world = rank_and_world(ctx)
    budget = -(-n_tokens // world)
    done = seen = 0
    for number, (_, text) in enumerate(iter_documents(corpus)):
        if done >= budget:
            break
        if number % world != rank or not text.strip():
            continue
        spans_a = token_spans(a.tokenizer, text, side="A")
        cut = corpus.context_size - 1
        if len(spans_a.ids) > cut:
            text = text[: int(spans_a.ends[cut - 1])]
            spans_a = token_spans(a.tokenizer, text, side="A")
        spans_b = token_spans(b.tokenizer, text, side="B")
        pairs = align_spans(spans_a, spans_b)
        seen += 1
        if not len(pairs.a):
            continue
        ids_a, off_a = _with_bos(a, torch.from_numpy(spans_a.ids))
        ids_b, off_b = _with_bos(b, torch.from_numpy(spans_b.ids))
        x_a, x_b = run_hooks(a, ids_a[None], hooks_a), run_hooks(b, ids_b[None], hooks_b)
        take = min(len(pairs.a), budget - done)
        done += take
        at_a, at_b = torch.from_numpy(pairs.a[:take] + off_a), torch.from_numpy(pairs.b[:take] + off_b)
        yield ({h: x[0][at_a.to(x.device)] for h, x in x_a.items()},
               {h: x[0][at_b.to(x.device)] for h, x in x_b.items()})
    if done == 0:
        raise InvalidInputError(f"the texts of corpus {corpus.source!r} do not align across the two tokenizers "
                                f"({seen} texts read on rank {rank}, no token of A ends at the same character "
                                "as a token of B)")


def paired_hook_activations(a: ModelHandle, hooks_a: list[str], b: ModelHandle, hooks_b: list[str],
                            corpus: CorpusSpec, *, n_tokens: int, batch_blocks: int = 8,
                            ctx: DistContext | None = None, progress: bool = True
                            ) -> Iterator[tuple[HookActs, HookActs]]:
    """This rank's activations of `hooks_a` of model `a` and `hooks_b` of model `b` at the
    same tokens of about `n_tokens` tokens of `corpus` (`{hook: [N, d]}` per side, rows
    paired; shared tokens for one tokenizer, character-aligned tokens for two)."""
    if n_tokens < 2:
        raise InvalidInputError(f"n_tokens must be at least 2, got {n_tokens}")
    for handle, hooks in ((a, hooks_a), (b, hooks_b)):
        for hook in hooks:
            handle.check_hook(hook)
    if same_tokenizer(a, b):
        return _same_tokens(a, hooks_a, b, hooks_b, corpus, n_tokens, batch_blocks, ctx, progress)
    return _aligned_texts(a, hooks_a, b, hooks_b, corpus, n_tokens, ctx)


def paired_activations(a: Side, b: Side, corpus: CorpusSpec, *, n_tokens: int, batch_blocks: int = 8,
                       ctx: DistContext | None = None, progress: bool = True) -> Iterator[PairedActs]:
    """This rank's paired activations of `a.hook` and `b.hook` over about `n_tokens` tokens
    of `corpus` (shared tokens for one tokenizer, character-aligned tokens for two)."""
    pairs = paired_hook_activations(a.handle, [a.hook], b.handle, [b.hook], corpus, n_tokens=n_tokens,
                                    batch_blocks=batch_blocks, ctx=ctx, progress=progress)
    return (PairedActs(x[a.hook], y[b.hook]) for x, y in pairs)
