"""Crystals on planted word pairs: relation offsets plus a dominant length distractor."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.crystals import crystal_quality, difference_vectors


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(0)
    d, n_rel, per = 128, 4, 30
    relations = rng.normal(size=(n_rel, d)) / np.sqrt(d) * 1.5
    distractor = rng.normal(size=d)
    distractor /= np.linalg.norm(distractor)
    n = n_rel * per
    words = rng.normal(size=(2 * n, d)) * 0.3
    labels = np.repeat(np.arange(n_rel), per)
    pairs = np.stack([np.arange(n), np.arange(n, 2 * n)], axis=1)
    # x(a) = x(b) + relation + length distractor (large variance) + pair noise
    words[:n] = (words[n:] + relations[labels] + np.outer(rng.normal(0, 4.0, n), distractor)
                 + 0.15 * rng.normal(size=(n, d)))
    return words, pairs, labels


def test_lda_heldout_beats_null_and_pca(planted):
    words, pairs, labels = planted
    diffs = difference_vectors(words, pairs)
    r = crystal_quality(diffs, labels, n_null=15, seed=0)
    assert r.heldout_silhouette > r.null_mean + 5 * r.null_std
    assert r.heldout_silhouette > 0.3 and r.null_mean < 0.05
    assert r.pca_silhouette < r.heldout_silhouette - 0.2  # the distractor dominates the PCs
    assert r.test_coords.shape == (r.n_test, 2) and r.p_value < 0.1


def test_random_labels_near_null_but_insample_positive(planted):
    words, pairs, labels = planted
    diffs = difference_vectors(words, pairs)
    fake = np.random.default_rng(3).permutation(labels)
    r = crystal_quality(diffs, fake, n_null=15, seed=0)
    assert abs(r.heldout_silhouette - r.null_mean) < 3 * r.null_std + 0.02
    # the in-sample trap: weakly regularised LDA "separates" random labels on its own training pairs
    weak = crystal_quality(diffs, fake, n_null=5, seed=0, shrinkage=0.01)
    assert weak.insample_silhouette > 0.2 > weak.heldout_silhouette + 0.1
    with pytest.raises(InvalidInputError):
        crystal_quality(diffs, np.zeros(len(diffs)))
    with pytest.raises(InvalidInputError):
        difference_vectors(words, np.array([[0, 10**6]]))
