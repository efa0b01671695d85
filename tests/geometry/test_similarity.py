"""SVCCA, RSA, correlations from running sums, mutual nearest neighbours and null tests."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.matching import match_features, mutual_nearest
from sae_atlas.geometry.similarity import (
    null_test,
    pearson_from_sums,
    permutation_p,
    random_rotation,
    random_rows,
    rsa,
    shuffled_rows,
    svcca,
)


def test_correlation_from_running_sums_is_pearson_and_dead_latents_are_zero():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 5)), rng.standard_normal((300, 4))
    b[:, 1] = 2 * a[:, 3] + 0.1 * b[:, 1]
    b[:, 2] = 0.0  # dead
    corr = pearson_from_sums(300, a.sum(0), b.sum(0), (a**2).sum(0), (b**2).sum(0), a.T @ b)
    with np.errstate(invalid="ignore"):
        expected = np.corrcoef(a.T, b.T)[:5, 5:]
    expected[:, 2] = 0
    assert np.allclose(corr, expected, atol=1e-10)
    with pytest.raises(InvalidInputError, match="at least 2 tokens"):
        pearson_from_sums(1, a[0], b[0], a[0], b[0], np.outer(a[0], b[0]))


def test_svcca_and_rsa_are_one_for_a_linear_copy_and_low_for_independent_spaces():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((400, 12))
    R = random_rotation(12, rng)
    assert svcca(X, 3.0 * X @ R) == pytest.approx(1.0)
    assert rsa(X, X @ R) == pytest.approx(1.0)
    assert svcca(X, X @ rng.standard_normal((12, 20))) == pytest.approx(1.0)  # any full-rank linear map
    Y = rng.standard_normal((400, 12))
    assert svcca(X, Y) < 0.2 and abs(rsa(X, Y)) < 0.1


def test_random_rotation_is_orthogonal():
    Q = random_rotation(9, np.random.default_rng(0))
    assert np.allclose(Q @ Q.T, np.eye(9), atol=1e-12)


def test_null_test_separates_paired_rows_from_shuffled_ones():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((200, 6))
    Y = X @ rng.standard_normal((6, 6)) + 0.3 * rng.standard_normal((200, 6))
    real = null_test(svcca, X, Y, shuffled_rows(X, Y), null="shuffled", n_perm=19, seed=0)
    assert real.score > 0.9 and real.null_mean < 0.3 and real.p_value == pytest.approx(1 / 20)
    unrelated = null_test(svcca, X, rng.standard_normal((200, 6)), random_rows(X, rng.standard_normal((500, 6))),
                          null="random", n_perm=19, seed=0)
    assert unrelated.p_value > 0.05
    assert permutation_p(0.5, np.array([0.1, 0.6, 0.7])) == pytest.approx(3 / 4)


def test_mutual_nearest_neighbours_and_matching():
    sim = np.array([[0.9, 0.1, 0.0], [0.8, 0.2, 0.1], [0.0, 0.3, 0.7]])
    rows, cols = mutual_nearest(sim)
    assert rows.tolist() == [0, 2] and cols.tolist() == [0, 2]
    match = match_features(sim)
    assert sorted(zip(match.pairs_a.tolist(), match.pairs_b.tolist(), strict=True)) == [(0, 0), (1, 1), (2, 2)]
    assert match.mcc == pytest.approx(0.6) and match.mean_max_a == pytest.approx(0.8)
    with pytest.raises(InvalidInputError, match="non-finite"):
        match_features(np.array([[np.nan]]))


def test_bad_shapes_are_refused():
    with pytest.raises(InvalidInputError, match="paired rows"):
        svcca(np.zeros((5, 2)), np.zeros((6, 2)))
    with pytest.raises(InvalidInputError, match="at least 10 rows"):
        random_rows(np.zeros((10, 2)), np.zeros((4, 2)))
