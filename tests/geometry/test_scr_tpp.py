"""SCR and TPP arithmetic on planted activations: a dictionary with the spurious attribute
(or each class) on its own latent scores high, a random dictionary near zero."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.scr_tpp import (
    BinaryTask,
    Pooled,
    ablate,
    fit_probe,
    latent_effects,
    probe_accuracy,
    scr_metrics,
    scr_score,
    top_latents,
    tpp_metrics,
)

N_VALUES = (2, 5, 500)
D = 8  # planted latents
DIM = 64  # activation width: random directions barely overlap the planted ones
PLANTED = np.eye(D, DIM)  # one decoder row per planted latent


def random_dictionary(rng):
    """`(encoder, decoder)` of a dictionary unrelated to the planted latents: a random
    orthonormal basis of the activations (reconstructs them exactly)."""
    basis, _ = np.linalg.qr(rng.normal(size=(DIM, DIM)))
    return basis, basis.T


def scr_split(n, seed, biased):
    """Texts with a label on latents 0 / 3 (weak; one per value) and a spurious attribute on
    latents 1 / 2 (strong); `biased` keeps only rows where they agree."""
    rng = np.random.default_rng(seed)
    label, spurious = rng.random(n) < 0.5, rng.random(n) < 0.5
    if biased:
        spurious = label.copy()
    codes = np.abs(rng.normal(scale=0.3, size=(n, D)))
    codes[:, 0] += 1.0 * label
    codes[:, 3] += 1.0 * ~label
    codes[:, 1] += 3.0 * spurious
    codes[:, 2] += 3.0 * ~spurious
    acts = codes @ PLANTED + rng.normal(scale=0.3, size=(n, DIM))
    return Pooled(acts, codes), label, spurious


def test_scr_rises_when_the_spurious_latent_is_ablated_and_not_a_random_one():
    train, label_tr, spur_tr = scr_split(800, 0, biased=False)
    test, label_te, spur_te = scr_split(800, 1, biased=False)
    agree = label_tr == spur_tr
    biased = fit_probe(train.acts[agree], label_tr[agree], seed=0)
    before = probe_accuracy(biased, test.acts, label_te)
    clean = probe_accuracy(fit_probe(train.acts, label_tr, seed=0), test.acts, label_te)
    assert clean - before > 0.15
    spurious_out = probe_accuracy(biased, ablate(test, PLANTED, np.array([1, 2])), label_te)
    random_out = probe_accuracy(biased, ablate(test, PLANTED, np.array([5, 6])), label_te)
    assert scr_score(spurious_out, before, clean) > 0.7
    assert abs(scr_score(random_out, before, clean)) < 0.1

    metrics, accuracies = scr_metrics(train, test, label_tr, spur_tr, label_te, spur_te, PLANTED, N_VALUES, seed=0)
    assert set(metrics) == {f"scr_{kind}_threshold_{n}" for kind in ("dir1", "dir2", "metric") for n in N_VALUES}
    assert accuracies["biased_on_label"] < accuracies["biased_on_spurious"]  # so the metric is dir1
    assert metrics["scr_metric_threshold_2"] == metrics["scr_dir1_threshold_2"] > 0.7

    rng = np.random.default_rng(2)
    W_enc, W_dec = random_dictionary(rng)
    codes_tr, codes_te = train.acts @ W_enc, test.acts @ W_enc
    random_metrics, _ = scr_metrics(Pooled(train.acts, codes_tr), Pooled(test.acts, codes_te), label_tr, spur_tr,
                                    label_te, spur_te, W_dec, N_VALUES, seed=0)
    assert random_metrics["scr_metric_threshold_2"] < 0.3


def tpp_data(n, seed, classes=4):
    """One latent per class (latents 0..classes-1), noise latents after."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(classes, size=n)
    codes = np.abs(rng.normal(scale=0.2, size=(n, D)))
    codes[np.arange(n), labels] += 2.0
    return Pooled(codes @ PLANTED + rng.normal(scale=0.2, size=(n, DIM)), codes), labels


def tasks(labels, classes=4):
    """Balanced one-vs-rest tasks: each class against as many rows of the others."""
    out = {}
    for cls in range(classes):
        pos, neg = np.flatnonzero(labels == cls), np.flatnonzero(labels != cls)[: int((labels == cls).sum())]
        rows = np.concatenate([pos, neg])
        out[str(cls)] = BinaryTask(rows, labels[rows] == cls)
    return out


def test_tpp_is_high_for_one_latent_per_class_and_near_zero_for_a_random_dictionary():
    train, labels_tr = tpp_data(600, 0)
    test, labels_te = tpp_data(600, 1)
    overall, per_class = tpp_metrics(train, test, tasks(labels_tr), tasks(labels_te), PLANTED, N_VALUES, seed=0)
    assert set(per_class) == {"0", "1", "2", "3"}
    assert set(overall) == {f"tpp_threshold_{n}_{kind}" for n in N_VALUES
                            for kind in ("total_metric", "intended_diff_only", "unintended_diff_only")}
    assert overall["tpp_threshold_2_intended_diff_only"] > 0.35
    assert abs(overall["tpp_threshold_2_unintended_diff_only"]) < 0.05
    assert overall["tpp_threshold_2_total_metric"] == pytest.approx(
        overall["tpp_threshold_2_intended_diff_only"] - overall["tpp_threshold_2_unintended_diff_only"])

    rng = np.random.default_rng(3)
    W_enc, W_dec = random_dictionary(rng)
    codes_tr, codes_te = train.acts @ W_enc, test.acts @ W_enc
    random_overall, _ = tpp_metrics(Pooled(train.acts, codes_tr), Pooled(test.acts, codes_te), tasks(labels_tr),
                                    tasks(labels_te), W_dec, N_VALUES, seed=0)
    assert abs(random_overall["tpp_threshold_2_total_metric"]) < 0.1
    with pytest.raises(InvalidInputError, match="two or more classes"):
        tpp_metrics(train, test, {"0": tasks(labels_tr)["0"]}, {"0": tasks(labels_te)["0"]}, PLANTED, (2,), seed=0)


def test_effects_top_latents_and_ablation():
    codes = np.array([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    y = np.array([True, False])
    W_dec = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    direction = np.array([1.0, -1.0])
    # mean differences (-2, 0, 2) times decoder . direction (1, -1, 0)
    assert latent_effects(codes, y, direction, W_dec, "scr").tolist() == [2.0, 0.0, 0.0]
    assert latent_effects(codes, y, direction, W_dec, "tpp").tolist() == [0.0, 0.0, 0.0]
    assert top_latents(np.array([0.5, 0.0, 2.0, 1.0]), 2).tolist() == [2, 3]
    assert top_latents(np.array([0.5, 0.0, 2.0, 1.0]), 500).tolist() == [2, 3, 0]  # only nonzero effects
    pooled = Pooled(np.array([[5.0, 5.0]]), np.array([[1.0, 2.0, 3.0]]))
    assert ablate(pooled, W_dec, np.array([0, 2])).tolist() == [[1.0, 2.0]]
    assert scr_score(0.8, 0.6, 0.6) == 0.0 and scr_score(0.8, 0.6, 1.0) == pytest.approx(0.5)
