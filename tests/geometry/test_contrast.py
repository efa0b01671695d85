"""Contrast statistics on planted sets: the planted features are found, the controls are not."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.contrast import (
    auroc,
    benjamini_hochberg,
    contrast_stats,
    duplicate_groups,
    ranked,
)

N_TEXTS, N_FEATURES, PLANTED = 40, 300, 12


def planted_sets(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse non-negative activations; features 0..PLANTED-1 fire more (or less) in A."""
    rng = np.random.default_rng(seed)

    def sparse(n: int, rate: float | np.ndarray) -> np.ndarray:
        return rng.exponential(1.0, (n, N_FEATURES)) * (rng.random((n, N_FEATURES)) < rate)

    rate_a = np.full(N_FEATURES, 0.2)
    rate_b = np.full(N_FEATURES, 0.2)
    rate_a[: PLANTED // 2] = 0.8  # higher in A
    rate_b[PLANTED // 2 : PLANTED] = 0.8  # higher in B
    return sparse(N_TEXTS, rate_a), sparse(N_TEXTS, rate_b), np.arange(PLANTED)


def test_planted_features_are_found_and_controls_are_not():
    a, b, planted = planted_sets()
    stats = contrast_stats(a, b, n_permutations=2000, seed=1)
    found = set(np.flatnonzero(stats.q_value_F <= 0.05).tolist())
    true = set(planted.tolist())
    precision = len(found & true) / max(len(found), 1)
    recall = len(found & true) / len(true)
    print(f"contrast planted: precision {precision:.3f} recall {recall:.3f} ({len(found)} found)")
    assert recall == 1.0 and precision >= 0.9
    assert (np.sign(stats.diff_F[: PLANTED // 2]) > 0).all() and (stats.diff_F[PLANTED // 2 : PLANTED] < 0).all()
    top = ranked(stats.frame, PLANTED)
    assert set(top["latent"].to_list()) == true and top["rank"].to_list() == list(range(PLANTED))


def test_auroc_matches_sklearn_with_ties():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 3, (15, 4)).astype(float)
    b = rng.integers(0, 3, (11, 4)).astype(float)
    y = np.r_[np.ones(15), np.zeros(11)]
    expected = [roc_auc_score(y, np.r_[a[:, j], b[:, j]]) for j in range(4)]
    assert np.allclose(auroc(a, b), expected)


def test_permutation_p_value_is_exact_for_complete_separation_and_one_for_identical_sets():
    a = np.tile([[5.0, 1.0]], (6, 1))
    b = np.tile([[0.0, 1.0]], (6, 1))
    stats = contrast_stats(a, b, n_permutations=999, seed=0)
    # C(12, 6) = 924 labelings; only 2 reach |diff| = 5, so p ~ 2/924 (+1 smoothing)
    assert stats.p_value_F[0] < 0.02
    assert stats.p_value_F[1] == 1.0 and stats.auroc_F[1] == 0.5


def test_inactive_features_are_not_tested():
    a, b, _ = planted_sets()
    a[:, 50] = 0
    b[:, 50] = 0
    stats = contrast_stats(a, b, n_permutations=50)
    assert not stats.tested_F[50] and stats.p_value_F[50] == 1.0 and stats.auroc_F[50] == 0.5
    assert 50 not in stats.frame["latent"].to_list()


def test_benjamini_hochberg_known_values():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    assert np.allclose(benjamini_hochberg(p), [0.02, 0.04, 0.04, 0.02])


def test_duplicate_groups_by_decoder_cosine():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(3, 16))
    rows = np.stack([base[0], base[1], base[0] + 0.01 * rng.normal(size=16), base[2], 2 * base[1]])
    assert duplicate_groups(rows, 0.95).tolist() == [0, 1, 0, 3, 1]


def test_bad_input_is_a_clear_error():
    with pytest.raises(InvalidInputError, match="at least 2 texts"):
        contrast_stats(np.ones((1, 3)), np.ones((4, 3)))
    with pytest.raises(InvalidInputError, match="one width"):
        contrast_stats(np.ones((3, 3)), np.ones((4, 2)))
