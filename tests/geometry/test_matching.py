"""Dictionary matching: MCC with Hungarian matching and atom recovery on planted dictionaries."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.matching import match_dictionaries


def atoms(n: int, d: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal((n, d))
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def test_the_planted_dictionary_itself_scores_one_in_any_order_and_scale():
    true = atoms(48, 32, 0)
    perm = np.random.default_rng(1).permutation(48)
    match = match_dictionaries(3.0 * true[perm], true)
    assert match.mcc == pytest.approx(1.0) and match.mean_best_cosine == pytest.approx(1.0)
    assert match.frac_recovered == 1.0
    assert (perm[match.matched_latent] == np.arange(48)).all()


def test_a_wider_dictionary_containing_the_atoms_recovers_them_all():
    true = atoms(24, 32, 0)
    learned = np.concatenate([atoms(40, 32, 5), true])
    match = match_dictionaries(learned, true)
    assert match.mcc == pytest.approx(1.0) and match.frac_recovered == 1.0
    assert (match.matched_latent >= 40).all()


def test_a_random_dictionary_scores_near_chance_and_recovers_nothing():
    true = atoms(48, 32, 0)
    match = match_dictionaries(atoms(48, 32, 7), true)
    assert match.mcc < 0.5 and match.frac_recovered == 0.0
    assert match.mcc == pytest.approx(match.mcc_chance, abs=0.08)


def test_refuses_mismatched_spaces_and_zero_rows():
    with pytest.raises(InvalidInputError, match="different spaces"):
        match_dictionaries(atoms(4, 8, 0), atoms(4, 16, 0))
    with pytest.raises(InvalidInputError, match="zero rows"):
        match_dictionaries(np.zeros((3, 8)), atoms(4, 8, 0))
