"""Absorption and splitting arithmetic on planted dictionaries: a child latent that absorbs
its parent's direction, the same dictionary without absorption, a concept split over two
latents, and the refusal to score too few letters."""

import numpy as np
import pytest

from sae_atlas.geometry.absorption import (
    MEAN_METRICS,
    AbsorptionThresholds,
    LetterAbsorption,
    absorption_fractions,
    absorption_scores,
    full_absorptions,
    ksparse_f1_curve,
    letter_absorption,
    split_latents,
)
from sae_atlas.geometry.probes import train_test_split

D, F = 16, 12


def planted_dictionary(absorbing: bool, n: int = 40, seed: int = 0):
    """Parent latent 0 (the letter's direction e0); child latent 1 fires on the child words
    (e0 + e1): with absorption its decoder row is e0 + e1 and the parent stays silent, without
    it the decoder row is e1 and the parent fires beside it. Latents 2.. are unrelated noise."""
    rng = np.random.default_rng(seed)
    eye = np.eye(D)
    decoder = np.vstack([eye[0], eye[0] + eye[1] if absorbing else eye[1], eye[2:F]])
    acts = eye[0] + eye[1] + 0.01 * rng.normal(size=(n, D))
    codes = np.zeros((n, F))
    if absorbing:
        codes[:, 1] = np.linalg.norm(eye[0] + eye[1])
    else:
        codes[:, 0], codes[:, 1] = 1.0, 1.0
    codes[:, 5] = rng.uniform(0, 0.5, n)  # an unrelated latent that fires too
    return acts, codes, decoder, eye[0]


def test_a_child_latent_that_absorbs_its_parent_scores_full_absorption():
    acts, codes, decoder, probe = planted_dictionary(absorbing=True)
    fractions = absorption_fractions(codes, acts, probe, decoder, [0])
    assert fractions.min() >= 0.9
    assert full_absorptions(codes, acts, probe, decoder, [0]).all()


def test_the_same_dictionary_without_absorption_scores_none():
    acts, codes, decoder, probe = planted_dictionary(absorbing=False)
    assert absorption_fractions(codes, acts, probe, decoder, [0]).max() <= 0.05
    assert not full_absorptions(codes, acts, probe, decoder, [0]).any()


def test_partial_absorption_is_the_absorbed_share_and_weak_absorbers_do_not_count():
    eye = np.eye(4)
    decoder = np.vstack([eye[0], eye[0] + eye[1], eye[0] * 0.05 + eye[2]])
    acts = (eye[0] + eye[1])[None]
    half = np.array([[0.5, 0.5 * np.sqrt(2), 0.0]])  # main carries 0.5 of the projection, the child 0.5
    assert absorption_fractions(half, acts, eye[0], decoder, [0]) == pytest.approx([0.5])
    weak = np.array([[0.2, 0.0, 3.0]])  # latent 2's cosine 0.05 < 0.1: not an absorber
    assert absorption_fractions(weak, acts, eye[0], decoder, [0]) == pytest.approx([0.0])


def test_split_latents_follow_the_f1_jumps():
    latents = [[3], [3, 7], [3, 7, 1], [3, 7, 1, 2]]
    assert split_latents([0.5, 0.9, 0.92, 0.99], latents) == [3, 7]  # 0.92 is not > 0.9 + 0.03
    assert split_latents([0.8, 0.81, 0.99, 0.99], latents) == [3]
    assert split_latents([0.5, 0.6, 0.7, 0.8], latents) == [3, 7, 1, 2]


def split_concept(n: int = 400, seed: int = 0):
    """A concept whose positives fire latent 2 or latent 6 (half each, never both); other
    latents are noise on every row."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.3
    codes = np.abs(rng.normal(0, 0.1, size=(n, F))) * (rng.random((n, F)) < 0.3)
    side = rng.random(n) < 0.5
    codes[y & side, 2] = rng.uniform(1, 2, (y & side).sum())
    codes[y & ~side, 6] = rng.uniform(1, 2, (y & ~side).sum())
    return codes, y


def test_the_ksparse_step_finds_a_concept_split_over_two_latents():
    codes, y = split_concept()
    f1s, latents = ksparse_f1_curve(codes, y, max_k=5)
    assert f1s[1] > f1s[0] + 0.03 and f1s[1] > 0.95
    assert sorted(split_latents(f1s, latents)) == [2, 6]


def test_letter_absorption_on_planted_activations_finds_the_probe_and_the_split():
    codes, y = split_concept()
    rng = np.random.default_rng(1)
    decoder = rng.normal(size=(F, D))
    acts = codes @ decoder + 0.01 * rng.normal(size=(len(y), D))
    result = letter_absorption("q", acts, codes, decoder, y, max_k=4)
    assert result.probe_f1 > 0.9 and sorted(result.split_latents) == [2, 6]
    assert len(result.fractions) == len(result.full) > 0
    assert result.detail()["num_split_features"] == 2


def letter(name: str, f1: float, fractions: list[float]) -> LetterAbsorption:
    return LetterAbsorption(name, f1, [0], np.arange(len(fractions)), np.asarray(fractions),
                            np.asarray(fractions) > 0.9)


def test_fewer_than_twenty_good_letters_are_not_scored():
    letters = [letter(chr(97 + i), 0.9 if i < 19 else 0.5, [1.0, 0.0]) for i in range(26)]
    refused = absorption_scores(letters)
    assert refused.refusal is not None and "19 first letters" in refused.refusal
    assert refused.metrics == dict.fromkeys(MEAN_METRICS) and refused.details == []


def test_scores_average_the_letters_with_a_good_probe():
    letters = [letter(chr(97 + i), 0.9, [1.0, 0.0] if i % 2 else [0.0, 0.0]) for i in range(20)]
    letters.append(letter("z", 0.6, [1.0, 1.0]))  # F1 not above 0.6: left out
    scores = absorption_scores(letters, AbsorptionThresholds())
    assert scores.refusal is None and len(scores.details) == 20
    assert scores.metrics["mean_absorption_fraction_score"] == pytest.approx(0.25)
    assert scores.metrics["mean_full_absorption_score"] == pytest.approx(0.25)
    assert scores.metrics["mean_num_split_features"] == 1.0
    assert scores.details[1] == {"first_letter": "b", "mean_absorption_fraction": 0.5, "full_absorption_rate": 0.5,
                                 "num_full_absorption": 1, "num_probe_true_positives": 2, "num_split_features": 1}


def many_small_absorbers(absorbing: bool, n: int = 600, seed: int = 0):
    """A letter (30% of rows) whose parent latent 0 fires on its words, except on a quarter
    of them where one of 15 child latents (1..15, a few words each: too small for the
    k-sparse step) fires instead, its decoder row parent + own direction; without
    absorption the child's row is its own direction and the parent fires beside it."""
    rng = np.random.default_rng(seed)
    d, f = 48, 40
    eye = np.eye(d)
    decoder = np.vstack([eye[0]] + [eye[0] * absorbing + eye[j] for j in range(1, 16)] + [eye[j] for j in range(16, f)])
    y = rng.random(n) < 0.3
    child = np.where(y & (rng.random(n) < 0.25), rng.integers(1, 16, n), 0)
    codes = np.zeros((n, f))
    codes[np.arange(n), 16 + rng.integers(0, f - 16, n)] = rng.uniform(0.5, 1.5, n)  # unrelated latents
    codes[y & ((child == 0) | (not absorbing)), 0] = rng.uniform(1, 2, (y & ((child == 0) | (not absorbing))).sum())
    codes[np.flatnonzero(child), child[child > 0]] = rng.uniform(1, 2, (child > 0).sum())
    return codes @ decoder + 0.01 * rng.normal(size=(n, d)), codes, decoder, y, child > 0


@pytest.mark.parametrize("absorbing", [True, False])
def test_letter_absorption_measures_planted_absorption_end_to_end(absorbing):
    acts, codes, decoder, y, absorbed = many_small_absorbers(absorbing)
    result = letter_absorption("s", acts, codes, decoder, y)
    assert result.probe_f1 > 0.95 and result.split_latents == [0]
    _, test = train_test_split(len(y), 0.2, 0)
    assert set(result.true_positives) <= set(test[y[test]]) and len(result.true_positives) >= 0.9 * y[test].sum()
    hit = absorbed[result.true_positives]
    assert hit.sum() >= 5 and len(result.fractions) == len(result.full) == len(hit)
    if absorbing:
        assert result.fractions[hit].min() >= 0.9 and result.full[hit].all()
    else:
        assert result.fractions[hit].max() <= 0.05 and not result.full.any()
    assert result.fractions[~hit].max() <= 0.05


def test_the_l1_ranking_puts_the_predictive_latents_first_and_the_anti_predictive_last():
    from sae_atlas.geometry.probes import l1_ranked_units

    codes, y = split_concept()
    codes[:, 9] = np.where(y, 0.0, 1.0)  # fires on the negatives only
    order = l1_ranked_units(codes, y)
    assert sorted(order[:2]) == [2, 6] and order[-1] == 9
