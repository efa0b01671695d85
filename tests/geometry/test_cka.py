"""Debiased linear CKA: planted similar and independent layers; streamed equals in-memory."""

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.cka import CKAAccumulator, debiased_cka


def layers(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 12)) @ rng.normal(size=(12, 24)) + 3.0  # low-rank, off-centre
    Q = np.linalg.qr(rng.normal(size=(24, 24)))[0]
    return {"x": X, "rotated": 7.5 * X @ Q - 2.0, "noise": rng.normal(size=(n, 16))}


def test_rotated_scaled_copy_is_one_and_noise_is_near_zero():
    L = layers()
    assert debiased_cka(L["x"], L["rotated"]) == pytest.approx(1.0, abs=1e-9)
    assert abs(debiased_cka(L["x"], L["noise"])) < 0.02
    half = L["x"][:, :12] + np.random.default_rng(1).normal(size=(600, 12))  # partly shared
    assert 0.1 < debiased_cka(L["x"], half) < 0.9


def test_streamed_equals_in_memory_and_ranks_merge_exactly():
    L = layers()
    names = list(L)
    whole = CKAAccumulator()
    rank0, rank1 = CKAAccumulator(), CKAAccumulator()
    for start in range(0, 600, 64):  # batches of 64, the last one short
        batch = {k: v[start:start + 64] for k, v in L.items()}
        whole.update({k: torch.from_numpy(v).float() if k == "noise" else v for k, v in batch.items()})
        (rank0 if start < 300 else rank1).update(batch)
    expected = np.array([[debiased_cka(L[a], L[b]) for b in names] for a in names])
    assert whole.layers == names and whole.n == 600
    assert np.allclose(whole.result(), expected, atol=1e-6)
    rank0.merge(rank1)
    assert rank0.n == 600 and np.allclose(rank0.result(), expected, atol=1e-9)
    empty = CKAAccumulator()
    empty.merge(rank0)
    assert np.allclose(empty.result(), expected, atol=1e-9)


def test_mismatched_batches_are_clear_errors():
    acc = CKAAccumulator()
    acc.update({"a": np.ones((3, 2)), "b": np.ones((3, 4))})
    with pytest.raises(InvalidInputError, match="at least 4 tokens"):
        acc.result()
    with pytest.raises(InvalidInputError, match="differ from the first batch"):
        acc.update({"a": np.ones((3, 2))})
    with pytest.raises(InvalidInputError, match="different token counts"):
        acc.update({"a": np.ones((3, 2)), "b": np.ones((2, 4))})
    with pytest.raises(InvalidInputError, match="widths"):
        acc.update({"a": np.ones((3, 3)), "b": np.ones((3, 4))})
    with pytest.raises(InvalidInputError, match="paired rows"):
        debiased_cka(np.ones((5, 2)), np.ones((4, 2)))


def test_map_sums_is_a_collective_sum():
    L = layers(n=100)
    twice, once = CKAAccumulator(), CKAAccumulator()
    twice.update(L)
    twice.merge(twice_copy := CKAAccumulator())  # an empty merge is a no-op
    assert twice_copy.n == 0
    once.update(L)
    twice.merge(once)
    once.map_sums(lambda a: 2 * a)  # what an all-reduce over two identical ranks gives
    assert once.n == twice.n == 200 and np.allclose(once.result(), twice.result(), atol=1e-12)


def test_split_keeps_only_the_cross_pairs_and_equals_the_full_block():
    L = layers()
    full, cross = CKAAccumulator(), CKAAccumulator(split=1)
    for start in range(0, 600, 100):
        batch = {k: v[start:start + 100] for k, v in L.items()}
        full.update(batch)
        cross.update(batch)
    assert set(cross._cross) == {(0, 0), (0, 1), (0, 2), (1, 1), (2, 2)}  # no (1, 2): both in the second set
    got, want = cross.result(), full.result()
    assert np.allclose(got[:1, 1:], want[:1, 1:], atol=1e-12) and np.allclose(np.diag(got), 1.0)
    assert np.isnan(got[1, 2]) and np.isnan(got[2, 1])
    with pytest.raises(InvalidInputError, match="both sides"):
        CKAAccumulator(split=3).update(L)
