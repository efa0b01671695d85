"""Circle probe, centred-frame replacement and periodic spectra on planted data."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.circle import (
    TWO_PI,
    circle_coords,
    fit_circle_probe,
    random_subspace,
    replace_on_circle,
    subspace_replace,
)
from sae_atlas.geometry.spectra import cluster_by_period, fourier_power


def planted(period=7, reps=7, d=40, noise=0.15, radius=2.0, offset=10.0, seed=0):
    """Activations with the concept on a circle in a random plane, far from the origin,
    plus larger nuisance variance in other directions."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(d, 6)))
    values = np.tile(np.arange(period), reps)
    th = TWO_PI * values / period
    nuisance = rng.normal(size=(len(values), 2)) * [1.0, 0.7]
    X = (
        offset * (Q[:, 0] + Q[:, 5]) / np.sqrt(2)  # the mean has a component in the plane
        + radius * (np.cos(th)[:, None] * Q[:, 0] + np.sin(th)[:, None] * Q[:, 1])
        + nuisance @ Q[:, 2:4].T
        + noise * rng.normal(size=(len(values), d))
    )
    return X, values, Q


def circ_dist(a, b, period):
    d = np.mod(np.asarray(a) - np.asarray(b), period)
    return np.minimum(d, period - d)


def test_probe_recovers_a_planted_circle_in_cyclic_order():
    X, v, _ = planted()
    probe = fit_circle_probe(X, v, 7)
    assert probe.r2 > 0.9 and probe.r2_loo > 0.9
    assert probe.cyclic_order and probe.adjacent_fraction == 1.0
    assert sorted(probe.order) == list(range(7))
    assert probe.fitted_period == pytest.approx(7, abs=0.05) and probe.period_fit > 0.99
    assert probe.r2_null < 0.5  # 49 samples: a permuted labelling does not fit
    assert circ_dist(probe.decode_value(X), v, 7).max() < 0.5


def test_probe_fails_on_shuffled_labels():
    X, v, _ = planted()
    for seed in range(3):
        shuffled = np.random.default_rng(seed).permutation(v)
        probe = fit_circle_probe(X, shuffled, 7)
        assert probe.r2_loo < 0.3 and probe.r2 < 0.5
        assert not probe.cyclic_order


def test_probe_detects_a_line_is_not_cyclic():
    # values laid out on a line: the fitted order is not a cycle
    rng = np.random.default_rng(0)
    v = np.tile(np.arange(12), 6)
    X = np.outer(v, rng.normal(size=20)) + 0.1 * rng.normal(size=(len(v), 20))
    probe = fit_circle_probe(X, v, 12)
    assert not probe.cyclic_order


def test_fitted_period_finds_the_true_period():
    X, v, _ = planted(period=12, reps=5)
    probe = fit_circle_probe(X, v, 12)
    assert probe.fitted_period == pytest.approx(12, abs=0.1)
    assert probe.cyclic_order


def test_order_is_read_without_supervision():
    # the planted circle visits the values in a scrambled order: the supervised probe
    # still fits (enough PCs for 7 classes), but the unsupervised order is not cyclic
    X, v, _ = planted(reps=7)
    scramble = np.array([0, 3, 6, 2, 5, 1, 4])
    probe = fit_circle_probe(X, scramble[v], 7)
    assert not probe.cyclic_order
    assert probe.adjacent_fraction < 0.5


@pytest.mark.parametrize("target", [0, 2, 5])
def test_replacement_moves_decoded_value_to_target(target):
    X, v, _ = planted()
    probe = fit_circle_probe(X, v, 7)
    moved = replace_on_circle(probe, X, TWO_PI * target / 7)
    assert circ_dist(probe.decode_value(moved), target, 7).max() < 0.5
    # only the circle plane changed
    off_plane = (moved - X) - ((moved - X) @ probe.plane_D2) @ probe.plane_D2.T
    assert np.abs(off_plane).max() < 1e-9


def test_replacement_lands_on_the_class_mean_in_the_centred_frame():
    # the planted mean sits far from the origin: mixing the uncentred frame would shift
    # every replaced point by the mean's component in the plane
    X, v, Q = planted(offset=10.0)
    probe = fit_circle_probe(X, v, 7)
    target = 3
    moved = replace_on_circle(probe, X, TWO_PI * target / 7)
    U = probe.plane_D2
    want = X[v == target].mean(0) @ U
    got = moved @ U
    assert np.abs(got - want).max() < 0.25
    coords = circle_coords(probe, np.array([TWO_PI * target / 7]))
    uncentred = X - (X @ U) @ U.T + coords @ U.T  # the reference code's trap
    assert np.abs(uncentred @ U - want).max() > 3.0


def test_subspace_replace_is_identity_when_coords_are_the_own_coordinates():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(10, 8))
    U = random_subspace(8, 2, seed=1)
    mean = X.mean(0)
    same = subspace_replace(X, U, mean, (X - mean) @ U)
    np.testing.assert_allclose(same, X, atol=1e-12)
    np.testing.assert_allclose(U.T @ U, np.eye(2), atol=1e-12)
    assert not np.allclose(random_subspace(8, 2, seed=1), random_subspace(8, 2, seed=2))


def test_probe_rejects_bad_input():
    X, v, _ = planted()
    with pytest.raises(InvalidInputError, match="values"):
        fit_circle_probe(X, v + 7, 7)
    with pytest.raises(InvalidInputError, match="shape|need"):
        fit_circle_probe(X[:, :, None], v, 7)
    with pytest.raises(InvalidInputError, match="fewer than 2"):
        fit_circle_probe(np.ones((20, 5)), np.arange(20) % 7, 7)


def test_fourier_spectra_find_planted_periods():
    rng = np.random.default_rng(0)
    p, reps = 12, 4
    v = np.tile(np.arange(p), reps)
    th = TWO_PI * v / p
    acts = np.c_[
        np.maximum(np.cos(th), 0),  # period 12
        np.maximum(np.cos(2 * th + 0.3), 0),  # period 6
        np.cos(3 * th) + 1,  # period 4
        np.ones(len(v)),  # flat
        rng.normal(size=len(v)) * 0.01,  # noise
    ]
    spec = fourier_power(acts, v, p)
    np.testing.assert_array_equal(spec.dominant_frequency_F[:4], [1, 2, 3, 0])
    assert spec.dominant_period_F[0] == 12 and spec.dominant_period_F[2] == 4
    np.testing.assert_allclose(spec.power_FK[:3].sum(1), 1.0)
    groups = cluster_by_period(spec, min_share=0.5, min_power=1e-3)
    assert list(groups) == [12.0, 6.0, 4.0]
    assert [g.tolist() for g in groups.values()] == [[0], [1], [2]]


def test_fourier_accepts_sparse_and_checks_coverage():
    import scipy.sparse as sp

    v = np.arange(7)
    acts = sp.csr_matrix(np.eye(7))
    assert fourier_power(acts, v, 7).power_FK.shape == (7, 3)
    with pytest.raises(InvalidInputError, match="every concept value"):
        fourier_power(np.ones((6, 2)), np.arange(6), 7)
    with pytest.raises(InvalidInputError, match=r"values must be integers in \[0, 7\), got int64 -1\.\.5"):
        fourier_power(np.ones((7, 2)), np.arange(-1, 6), 7)
    with pytest.raises(InvalidInputError, match="need rows"):
        fourier_power(np.ones(7), np.arange(7), 7)
