"""Intrinsic dimension: TwoNN, the Levina-Bickel MLE and local ID on planted manifolds."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.intrinsic_dimension import local_dimension, mle_dimension, twonn_dimension


def embedded(d, n=3000, D=64, noise=1e-4, seed=0):
    """`n` Gaussian points on a `d`-dimensional subspace of R^D, plus small isotropic noise."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.normal(size=(D, d)))[0]
    return rng.normal(size=(n, d)) @ Q.T + noise * rng.normal(size=(n, D))


@pytest.mark.parametrize("d", [2, 5, 10])
def test_twonn_and_mle_recover_planted_dimension(d):
    X = embedded(d, seed=d)
    assert twonn_dimension(X).dimension == pytest.approx(d, rel=0.10)
    mle = mle_dimension(X, k=10, seed=3)
    assert mle.dimension == pytest.approx(d, rel=0.10)
    assert mle.low <= mle.dimension <= mle.high and mle.high - mle.low < 0.2 * d
    assert mle == mle_dimension(X, k=10, seed=3)  # seeded


def test_twonn_bootstrap_interval_covers_the_planted_dimension_and_narrows_with_points():
    small, large = (twonn_dimension(embedded(5, n=n, seed=1), n_boot=200, seed=2) for n in (400, 4000))
    for est in (small, large):
        assert est.low < est.dimension < est.high and 0.9 * est.low <= 5 <= 1.1 * est.high  # TwoNN's bias < 10%
    assert large.high - large.low < 0.6 * (small.high - small.low)  # ~1/sqrt(10) of the width, with slack
    assert twonn_dimension(embedded(5, n=400, seed=1)).low is None  # no resamples, no interval
    assert twonn_dimension(embedded(5, n=400, seed=1), n_boot=200, seed=2) == small  # seeded


def test_mle_subsample_and_duplicates():
    X = embedded(5, n=2000)
    dup = np.concatenate([X, X[:300]])  # exact duplicates are dropped, not fatal
    est = mle_dimension(dup, k=10, max_points=5000)
    assert est.n_points == 2300 and est.n_used == 2000
    assert est.dimension == pytest.approx(5, rel=0.10)
    assert mle_dimension(X, k=10, max_points=1000).n_used == 1000


def test_local_dimension_separates_planted_clusters():
    low = embedded(2, n=1500, seed=1)
    high = embedded(12, n=1500, seed=2) + 100.0  # far apart: neighbours stay within a cluster
    lid = local_dimension(np.concatenate([low, high]), k=20)
    assert lid.shape == (3000,)
    assert np.median(lid[:1500]) == pytest.approx(2, rel=0.2)
    assert np.median(lid[1500:]) > 8
    assert np.quantile(lid[:1500], 0.95) < np.quantile(lid[1500:], 0.05)
    dup = local_dimension(np.concatenate([low, low[:5]]), k=20)
    assert np.array_equal(dup[-5:], dup[:5])  # a duplicate row shares its row's value


def test_too_few_points_for_k_is_a_clear_error():
    X = embedded(3, n=15)
    with pytest.raises(InvalidInputError, match="k=20 needs more than 20 distinct points, got 15"):
        local_dimension(X, k=20)
    with pytest.raises(InvalidInputError, match="k=20"):
        mle_dimension(np.concatenate([X, X]), k=20)
    with pytest.raises(InvalidInputError, match="k >= 3"):
        local_dimension(X, k=2)
    with pytest.raises(InvalidInputError, match="non-finite"):
        mle_dimension(np.full((30, 4), np.nan))
