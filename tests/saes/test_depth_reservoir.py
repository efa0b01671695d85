"""The depth stream's token subsample (`saes.depth.reservoir`) equals the in-memory one: the
rows with the smallest keys among everything offered, in insertion order; and the stream's
subsample is exactly those rows of the whole stream under the seeded per-batch keys."""

import numpy as np
import pytest

from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.depth.capture import stream_depth
from sae_atlas.saes.depth.reservoir import Reservoir
from sae_atlas.saes.models import tiny_model


@pytest.mark.parametrize("capacity", [1, 5, 40, 1000])
def test_reservoir_keeps_the_smallest_keys_in_insertion_order(capacity: int) -> None:
    rng = np.random.default_rng(0)
    sample = Reservoir(capacity, [((3, 2), np.float32), ((), np.int64)])
    all_keys, all_values = [], []
    called = []
    for size in rng.integers(0, 30, size=25):
        keys = rng.random(size)
        values = rng.normal(size=(size, 3, 2)).astype(np.float32)
        ids = sum(map(len, all_keys)) + np.arange(size, dtype=np.int64)  # insertion numbers

        def rows(index: np.ndarray, values: np.ndarray = values, ids: np.ndarray = ids) -> list[np.ndarray]:
            called.append(len(index))
            return [values[index], ids[index]]

        sample.offer(keys, rows)
        all_keys.append(keys)
        all_values.append(values)
    keys, values = np.concatenate(all_keys), np.concatenate(all_values)
    expected = np.sort(np.argsort(keys)[:capacity])  # the smallest keys, in the order offered
    got_keys, (got_values, got_ids) = sample.rows()
    assert np.array_equal(got_ids, expected)
    assert np.array_equal(got_keys, keys[expected]) and np.array_equal(got_values, values[expected])
    assert sum(called) <= len(keys)  # only entering rows were asked for


def test_stream_subsample_is_the_smallest_keyed_tokens_of_the_whole_stream() -> None:
    handle, corpus = tiny_model(arch="llama", n_layers=4, seed=3), CorpusSpec(context_size=32)

    def run(max_points: int):
        return stream_depth(handle, corpus, [0, 1, 2, 3], n_tokens=32 * 12, batch_blocks=3, max_points=max_points,
                            seed=7, progress=False)

    whole, part = run(10_000), run(60)
    assert len(whole.states) == whole.n_tokens > 60
    keys = np.concatenate([np.random.default_rng([7, first]).random(int((whole.block // 3 * 3 == first).sum()))
                           for first in range(0, 12, 3)])  # whole is in stream order: batch by batch
    chosen = np.sort(np.argsort(keys)[:60])
    for name in ("states", "block", "position", "doc", "token", "context"):
        assert np.array_equal(getattr(part, name), getattr(whole, name)[chosen]), name
