"""Mixture and separability indices on planted point clouds (Engels et al. 2024 numbers)."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.irreducibility import (
    irreducibility,
    mixture_index,
    mutual_information_bits,
    separability_index,
)

N = 4000


def clouds(seed: int = 0, n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * np.pi, n)
    a = rng.normal(size=n)
    on_first = rng.random(n) < 0.5
    lines = np.where(on_first[:, None], np.c_[a, np.zeros(n)], np.c_[np.zeros(n), a])
    th = 0.4
    rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    return {
        "circle": np.c_[np.cos(t), np.sin(t)] + 0.06 * rng.normal(size=(n, 2)),
        "gaussian": rng.normal(size=(n, 2)),
        "lines": lines + 0.02 * rng.normal(size=(n, 2)),
        "square": rng.uniform(-1, 1, (n, 2)) @ rot.T,
    }


@pytest.fixture(scope="module")
def scores():
    return {k: (mixture_index(X), separability_index(X)) for k, X in clouds().items()}


def test_prototype_numbers(scores):
    # reference (n=4000): circle M 0.20 S 1.18; Gaussian M 0.10 S 0.01;
    # two lines M 0.53 S 0.34; rotated independent square M 0.12 S 0.014
    m, s = scores["circle"]
    assert 0.15 < m < 0.25 and 0.95 < s < 1.4
    m, s = scores["gaussian"]
    assert 0.07 < m < 0.13 and s < 0.04
    m, s = scores["lines"]
    assert 0.45 < m < 0.62
    m, s = scores["square"]
    assert 0.09 < m < 0.15 and s < 0.04


def test_circle_has_the_highest_combined_score(scores):
    combined = {k: (1 - m) * s for k, (m, s) in scores.items()}
    assert max(combined, key=combined.get) == "circle"
    assert combined["circle"] > 2 * max(v for k, v in combined.items() if k != "circle")


def oracle_mixture(X: np.ndarray, eps: float, n_angles: int = 360, n_c: int = 600) -> float:
    """Exhaustive grid over directions v and offsets c, counting points directly."""
    best = 0.0
    for theta in np.arange(n_angles) * np.pi / n_angles:
        p = X @ np.array([np.cos(theta), np.sin(theta)])
        c = -np.linspace(p.min(), p.max(), n_c)[:, None]  # [n_c, 1]
        q = p[None, :] + c
        radius = eps * np.sqrt((q**2).mean(1, keepdims=True))
        best = max(best, float((np.abs(q) < radius).mean(1).max()))
    return best


@pytest.mark.parametrize("name", ["circle", "gaussian", "lines", "square"])
def test_mixture_index_agrees_with_grid_search_oracle(name):
    X = clouds(seed=1, n=800)[name]
    got, want = mixture_index(X, 0.1), oracle_mixture(X, 0.1)
    assert abs(got - want) <= 0.01, (got, want)


def test_mixture_index_is_invariant_to_translation_and_scale():
    X = clouds(n=1000)["lines"]
    assert mixture_index(X) == pytest.approx(mixture_index(3.0 * X + [5.0, -2.0]), abs=0.01)


def test_mutual_information_of_independent_and_dependent_pairs():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, N))
    assert mutual_information_bits(x, y) < 0.03
    assert mutual_information_bits(x, x) == pytest.approx(np.log2(10), abs=1e-9)


def test_irreducibility_scores_consecutive_pairs():
    rng = np.random.default_rng(0)
    Z = np.c_[clouds(n=2000)["circle"], 0.3 * rng.normal(size=2000)]
    out = irreducibility(Z, max_points=1500)
    assert len(out["mixture"]) == len(out["separability"]) == len(out["pair_score"]) == 2
    assert out["pair_score"][0] > 3 * out["pair_score"][1]
    assert out["score"] == pytest.approx(np.mean(out["pair_score"]))


def test_bad_input_is_rejected():
    with pytest.raises(InvalidInputError, match="shape"):
        mixture_index(np.zeros((10, 3)))
    with pytest.raises(InvalidInputError, match="eps"):
        mixture_index(np.ones((10, 2)), eps=2.0)
    with pytest.raises(InvalidInputError, match="NaN"):
        separability_index(np.full((10, 2), np.nan))
