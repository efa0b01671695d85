"""Probes on planted data: a concept carried by one SAE latent but smeared over neurons."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.probes import (
    compare_sparse_probes,
    diff_means_probe,
    ksparse_probe,
    logistic_probe,
    probe_layers,
    ridge_probe,
)


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(0)
    n, d, f = 2000, 24, 96
    y = rng.random(n) < 0.3
    latents = (rng.random((n, f)) < 0.05) * rng.exponential(1.0, (n, f))
    latents[:, 7] = y * (1.0 + rng.random(n))  # latent 7 is the concept
    W_dec = rng.normal(size=(f, d)) / np.sqrt(d)
    neurons = latents @ W_dec + 0.05 * rng.normal(size=(n, d))
    return neurons, latents, y, rng


def test_dense_probes_separate(planted):
    neurons, _, y, _ = planted
    dm, lr = diff_means_probe(neurons, y), logistic_probe(neurons, y)
    assert dm.test_score > 0.8 > dm.baseline + 0.05
    assert lr.test_score > 0.85 and lr.test_score >= dm.test_score
    # the returned direction and bias act in the input's own coordinates
    assert ((neurons @ lr.direction_D + lr.bias > 0) == y).mean() > 0.85
    with pytest.raises(InvalidInputError):
        diff_means_probe(neurons, np.ones(len(y)))


def test_ksparse_latents_beat_neurons_at_k1(planted):
    neurons, latents, y, _ = planted
    r = ksparse_probe(latents, y, 1)
    assert r.features.tolist() == [7] and r.test_score > 0.99
    table = compare_sparse_probes({"neurons": neurons, "latents": latents}, y, ks=(1, 4))
    acc = {(b, k): a for b, k, a in table.select("basis", "k", "test_accuracy").iter_rows()}
    assert acc[("latents", 1)] > acc[("neurons", 1)] + 0.05
    with pytest.raises(InvalidInputError):
        ksparse_probe(latents, y, 0)


def test_ridge_per_layer(planted):
    _, _, _, rng = planted
    pos = rng.integers(0, 128, 1500).astype(float)
    direction = rng.normal(size=16)
    good = np.outer(pos, direction) / 100 + rng.normal(size=(1500, 16))
    noise = rng.normal(size=(1500, 16))
    table = probe_layers({"blocks.1": good, "blocks.2": noise}, pos, "ridge")
    scores = dict(zip(table["layer"], table["test_score"], strict=True))
    assert scores["blocks.1"] > 0.5 and scores["blocks.2"] < 0.05
    assert ridge_probe(good, pos).test_score == pytest.approx(scores["blocks.1"])
    with pytest.raises(InvalidInputError):
        probe_layers({"a": good}, pos, "svm")
