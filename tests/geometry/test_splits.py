"""The one split rule (hold out round(n * frac), at least 1, leaving 2 to train; per label
when stratified) and the one zero-row rule of `unit_rows`."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.splits import split_rows, stratified_split
from sae_atlas.geometry.vectors import unit_rows


def test_split_rows_holds_out_round_n_frac_within_bounds():
    rng = np.random.default_rng(0)
    for n, frac, n_test in [(10, 0.25, 2), (3, 0.01, 1), (5, 0.9, 3), (7, 0.0, 0)]:
        train, test = split_rows(n, frac, rng)
        assert len(test) == n_test and sorted([*train, *test]) == list(range(n))
    with pytest.raises(InvalidInputError, match=">= 3 rows"):
        split_rows(2, 0.5, rng)
    with pytest.raises(InvalidInputError, match=r"\[0, 1\)"):
        split_rows(10, 1.0, rng)


def test_the_same_seed_gives_the_same_split():
    a = split_rows(20, 0.3, np.random.default_rng(4))
    b = split_rows(20, 0.3, np.random.default_rng(4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_stratified_split_tests_and_trains_every_label():
    labels = np.array(["a"] * 3 + ["b"] * 10)
    train, test = stratified_split(labels, 0.3, np.random.default_rng(1))
    assert sorted([*train, *test]) == list(range(13))
    assert sorted(labels[test].tolist()) == ["a", "b", "b", "b"]
    with pytest.raises(InvalidInputError, match="'c' has 2 pairs"):
        stratified_split(np.array(["a"] * 3 + ["c"] * 2), 0.3, np.random.default_rng(1))


def test_zero_rows_stay_zero_or_are_refused():
    M = np.array([[3.0, 4.0], [0.0, 0.0]])
    assert np.allclose(unit_rows(M), [[0.6, 0.8], [0.0, 0.0]])
    with pytest.raises(InvalidInputError, match="the atoms has 1 zero rows"):
        unit_rows(M, zero_rows="refuse", what="the atoms")
    with pytest.raises(InvalidInputError, match="non-empty 2-D"):
        unit_rows(np.zeros(3))
