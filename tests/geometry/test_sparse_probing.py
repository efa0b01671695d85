"""SAEBench-style sparse probing scores on planted codes: one latent carrying the label."""

import numpy as np

from sae_atlas.geometry.probes import sparse_probing_accuracies


def planted(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Residuals with the label along one direction, codes in which latent 7 carries it."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    resid = rng.standard_normal((n, 16))
    resid[:, 3] += 3.0 * y
    codes = np.maximum(rng.standard_normal((n, 32)) - 1.0, 0.0)  # sparse, label-free latents
    codes[:, 7] = 2.0 * y + 0.05 * rng.random(n)
    return resid, codes, y


def test_one_latent_carrying_the_label_reaches_the_full_probe_with_k_1():
    resid, codes, y = planted()
    scores = sparse_probing_accuracies({"llm": resid, "sae": codes}, y, (1, 2, 5))
    assert scores["llm_test_accuracy"] > 0.9
    assert scores["sae_top_1_test_accuracy"] >= scores["llm_test_accuracy"] - 0.02
    assert scores["sae_top_1_test_accuracy"] == 1.0
    assert set(scores) == {f"{b}_{s}test_accuracy" for b in ("llm", "sae") for s in ("", "top_1_", "top_2_", "top_5_")}


def test_a_shuffled_label_stays_at_chance():
    resid, codes, y = planted()
    shuffled = np.random.default_rng(3).permutation(y)
    scores = sparse_probing_accuracies({"llm": resid, "sae": codes}, shuffled, (1, 2, 5))
    for key in ("sae_top_1_test_accuracy", "sae_top_5_test_accuracy", "llm_test_accuracy"):
        assert 0.3 < scores[key] < 0.7, (key, scores[key])


def test_k_wider_than_the_basis_is_skipped():
    resid, codes, y = planted()
    scores = sparse_probing_accuracies({"narrow": codes[:, :2]}, y, (1, 5))
    assert "narrow_top_5_test_accuracy" not in scores and "narrow_top_1_test_accuracy" in scores
