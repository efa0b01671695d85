"""The streamed training source: rows of every hook pair up token by token, BOS and separators
never appear, windows are deterministic from (seed, position), a resumed source continues
exactly, ranks stream disjoint windows, and bad sizes are refused before any forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle, tiny_model
from sae_atlas.saes.streaming import special_ids
from sae_atlas.saes.train import stream_source
from sae_atlas.saes.train.stream_source import StreamSource
from sae_atlas.store.activations import excluded_positions

CORPUS = CorpusSpec(context_size=16)
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
# 32 rows a batch; a window is 4 batches of 2 blocks (128 tokens, 120 kept at most)
ARGS = {"batch_size": 32, "batch_blocks": 2, "buffer_tokens": 128}


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return tiny_model(n_layers=2, d_model=16, n_heads=2, d_mlp=32, seed=4)


def _source(handle: ModelHandle, steps: int = 9, **overrides) -> StreamSource:
    return StreamSource(handle, CORPUS, HOOKS, steps=steps, **{**ARGS, **overrides})


def _take(source: StreamSource, n: int) -> list[dict[str, torch.Tensor]]:
    return [source.next_batch() for _ in range(n)]


def _kept_rows(handle: ModelHandle, n_blocks: int) -> dict[str, torch.Tensor]:
    """Every kept token row of the first blocks, straight from a forward (and under "block",
    the block of each row)."""
    blocks = next(iter_blocks(handle.tokenizer, CORPUS, max_blocks=n_blocks, batch_blocks=n_blocks))
    n, T = blocks.token_ids.shape
    excluded = excluded_positions(blocks.token_ids, torch.arange(T).expand(n, T), prepend_bos=True,
                                  special_ids=special_ids(handle))
    acts = run_hooks(handle, blocks.token_ids, HOOKS)
    acts["block"] = torch.arange(n).repeat_interleave(T)
    return {h: a.reshape(n * T, -1).squeeze(-1)[~excluded.reshape(-1)] for h, a in acts.items()}


def test_rows_pair_up_token_by_token_and_leave_out_bos(handle: ModelHandle) -> None:
    source = _source(handle)
    per_window = source.plan.per_window[0][0]
    batches = _take(source, per_window)
    direct = _kept_rows(handle, 8)  # window 0: 4 batches of 2 blocks
    a, b = HOOKS
    got_a, got_b = torch.cat([x[a] for x in batches]), torch.cat([x[b] for x in batches])
    assert got_a.dtype == torch.float32 and got_a.shape == (per_window * 32, 16)
    match = torch.cdist(got_a, direct[a]).argmin(1)  # one forward of 8 blocks, not 4 of 2: close, not equal
    assert torch.allclose(got_a, direct[a][match], atol=1e-5) and torch.allclose(got_b, direct[b][match], atol=1e-5)
    assert match.tolist() != sorted(match.tolist())  # shuffled across the window's documents
    bos_row = run_hooks(handle, torch.tensor([[handle.bos_token_id]]), [a])[a][0, 0]
    assert (got_a - bos_row).abs().amax(1).min() > 1e-3


def test_same_seed_same_stream_other_seed_other_order(handle: ModelHandle) -> None:
    first, again, other = _source(handle), _source(handle), _source(handle, seed=1)
    one, two, three = _take(first, 9), _take(again, 9), _take(other, 9)
    assert all(torch.equal(x[h], y[h]) for x, y in zip(one, two, strict=True) for h in HOOKS)
    assert not torch.equal(one[0][HOOKS[0]], three[0][HOOKS[0]])


def test_rows_a_window_leaves_over_carry_into_the_next_window(handle: ModelHandle) -> None:
    source = _source(handle)
    (n0, n1), (c0, c1) = source.plan.per_window[0][:2], source.plan.carried[0][:2]
    assert c0 > 0  # window 0 keeps ~120 rows: 3 batches of 32 and a tail
    rows = torch.cat([b[HOOKS[0]] for b in _take(source, n0 + n1)])
    direct = _kept_rows(handle, 16)  # windows 0 and 1 (8 blocks each, one lane)
    assert len(rows) == len(direct[HOOKS[0]]) - c1  # nothing dropped but window 1's own tail
    near = torch.cdist(rows, direct[HOOKS[0]]) < 1e-4  # (repeated tokens may give equal rows)
    same = torch.cdist(direct[HOOKS[0]], direct[HOOKS[0]]) < 1e-4
    assert near.any(1).all() and (near.sum(0) <= same.sum(0)).all()  # each token at most once
    window0 = direct["block"] < 8
    assert near[:, window0].any(0).all()  # every token of window 0, its tail included
    assert near[n0 * 32:, window0].any(1).sum() >= c0  # the tail handed out with window 1's batches


@pytest.mark.parametrize("after", [1, 3, 5])  # mid-window, a window boundary (3 batches a window), after a carry
def test_resumed_source_continues_exactly(handle: ModelHandle, after: int) -> None:
    whole = _take(_source(handle), 9)
    first = _source(handle)
    _take(first, after)
    state = first.state_dict()
    resumed = _source(handle)
    resumed.load_state_dict(state)
    rest = _take(resumed, 9 - after)
    assert all(torch.equal(x[h], y[h]) for x, y in zip(whole[after:], rest, strict=True) for h in HOOKS)


def test_a_checkpoint_of_another_stream_is_refused(handle: ModelHandle) -> None:
    state = _source(handle).state_dict()
    with pytest.raises(InvalidInputError, match="seed"):
        _source(handle, seed=5).load_state_dict(state)


def test_two_ranks_stream_their_own_lanes_and_together_give_one_process_batches(handle: ModelHandle) -> None:
    ranks = [_source(handle, ctx=DistContext(rank, 2, 0)) for rank in range(2)]
    rows = [torch.cat([b[HOOKS[0]] for b in _take(source, 5)]) for source in ranks]
    assert all(len(r) == 5 * 16 for r in rows)  # half the global batch each
    direct = _kept_rows(handle, 16)
    lane_of_row = direct["block"] // 8  # blocks 0-7 are lane 0's window 0, 8-15 lane 1's
    windows = [direct[HOOKS[0]][lane_of_row == lane] for lane in range(2)]
    for rank in range(2):
        assert torch.cdist(rows[rank], windows[rank]).min(1).values.max() < 1e-3  # its own window's tokens
    assert ranks[0].state_dict() == ranks[1].state_dict()
    alone = torch.cat([b[HOOKS[0]] for b in _take(_source(handle, lanes=2), 5)])
    assert torch.equal(alone, torch.cat([r.reshape(5, 16, -1) for r in rows], 1).reshape(-1, 16))


def test_heldout_rows_come_after_the_training_blocks(handle: ModelHandle) -> None:
    source = _source(handle, heldout_tokens=40)
    assert source.plan.heldout_blocks == 3
    held = list(source.heldout_batches(16))
    direct = _kept_rows(handle, source.plan.n_blocks + 4)  # the held-out blocks (3) sit in a batch of 2
    after = direct[HOOKS[1]][direct["block"] >= source.plan.n_blocks]
    rows = torch.cat([b[HOOKS[1]] for b in held])
    assert len(rows) >= 40 and torch.allclose(rows, after[:len(rows)], atol=1e-5)
    assert list(_source(handle, heldout_tokens=0).heldout_batches(16)) == []


def test_unknown_hook_is_refused(handle: ModelHandle) -> None:
    with pytest.raises(UnknownHookError, match="blocks.7.hook_resid_post"):
        StreamSource(handle, CORPUS, ["blocks.7.hook_resid_post"], steps=1, **ARGS)


def test_buffer_larger_than_memory_is_refused(handle: ModelHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_source, "available_memory", lambda device: 10_000)
    with pytest.raises(InvalidInputError, match="--buffer-tokens 128 needs .* free"):
        _source(handle)
    assert _source(handle, buffer_tokens=None).buffer_tokens == 64  # the default shrinks to two batches


def test_the_default_buffer_of_a_short_run_is_sized_to_the_run(handle: ModelHandle) -> None:
    source = _source(handle, steps=9, buffer_tokens=None)  # 9 x 32 rows: 306 tokens with the margin
    assert source.buffer_tokens == 9 * 32 + 9 * 32 // 16
    # not one 262,144-token window for a 288-token run: at most two run-sized windows (the
    # 16-token blocks of short documents lose about a fifth of their tokens to BOS and separators)
    assert len(source.plan.per_window[0]) <= 2
    assert source.plan.n_blocks * CORPUS.context_size <= 3 * 9 * 32
    long_run = stream_source.resolve_buffer_tokens(None, handle, HOOKS, 32, run_tokens=10**7)
    assert long_run == stream_source.DEFAULT_BUFFER_TOKENS


def test_buffer_smaller_than_a_batch_is_refused(handle: ModelHandle) -> None:
    with pytest.raises(InvalidInputError, match="less than one batch"):
        _source(handle, buffer_tokens=16)
    with pytest.raises(InvalidInputError, match="keeps only 30 tokens"):  # 32 tokens less BOS
        _source(handle, buffer_tokens=32)


def test_short_corpus_is_refused_before_any_forward(handle: ModelHandle, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    text = tmp_path / "short.txt"
    text.write_text(" ".join(["the cat sat on the mat ."] * 60))
    monkeypatch.setattr(stream_source, "stream_activations", lambda *a, **k: pytest.fail("a forward ran"))
    with pytest.raises(InvalidInputError, match=r"corpus .*short.txt.* is too short.*3200 training tokens"):
        StreamSource(handle, CorpusSpec(source=str(text), context_size=16), HOOKS, steps=100, **ARGS)
