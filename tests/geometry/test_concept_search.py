"""Concept search on planted structure: a period-7 circle of features among random ones,
and categories on separate directions."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.concept_search import concept_features, greedy_span, search_concept

D, N_RANDOM, PER_VALUE = 32, 73, 30


def planted_circle(period: int = 7, seed: int = 0) -> dict:
    """Features 0..period-1 have decoder rows around a circle in one plane and fire on the
    values near their angle; the others fire at random with random directions."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(D, D)))
    phi = 2 * np.pi * np.arange(period) / period
    W = np.r_[np.c_[np.cos(phi), np.sin(phi)] @ basis[:, :2].T, rng.normal(size=(N_RANDOM, D)) / np.sqrt(D)]
    values = np.repeat(np.arange(period), PER_VALUE)
    theta = 2 * np.pi * values / period
    circle = np.maximum(np.cos(theta[:, None] - phi[None, :]) - 0.3, 0) * 2.0
    circle *= rng.uniform(0.7, 1.3, circle.shape)
    random = rng.exponential(0.2, (len(values), N_RANDOM)) * (rng.random((len(values), N_RANDOM)) < 0.6)
    A = np.c_[circle, random]
    X = A @ W + 0.05 * rng.normal(size=(len(values), D))
    perm = rng.permutation(A.shape[1])  # the feature order must not matter: shuffle columns
    circle_cols = set(np.argsort(perm)[:period].tolist())
    return {"X": X, "A": A[:, perm], "W": W[perm], "values": values, "circle": circle_cols,
            "period": period}


@pytest.mark.parametrize("period", [7, 12])
def test_planted_circle_gives_exactly_its_features_and_period(period):
    p = planted_circle(period)
    fit = search_concept(p["X"], p["A"], p["values"], p["W"], "ordered", period)
    selective = set(fit.features.filter(fit.features["selective"])["latent"].to_list())
    assert selective == p["circle"]
    assert set(fit.span.latents) <= p["circle"] and len(fit.span.latents) == 2  # a plane: two directions
    assert fit.span.total > 0.85
    assert fit.fit["cyclic_order"] and abs(fit.fit["fitted_period"] - period) < 0.5 and fit.fit["r2_loo"] > 0.8


def test_random_features_alone_give_no_circle():
    p = planted_circle(7)
    rest = sorted(set(range(p["A"].shape[1])) - p["circle"])
    fit = search_concept(p["X"], p["A"][:, rest], p["values"], p["W"][rest], "ordered", 7)
    assert not fit.features["selective"].any()
    assert fit.span.latents == [] and "cyclic_order" not in fit.fit and fit.score == float("-inf")


def test_categories_on_separate_directions():
    rng = np.random.default_rng(1)
    n_cat, per = 4, 25
    values = np.repeat(np.arange(n_cat), per)
    W = rng.normal(size=(40, D))
    A = rng.exponential(0.2, (len(values), 40)) * (rng.random((len(values), 40)) < 0.5)
    A[:, :n_cat] = 0
    A[np.arange(len(values)), values] = rng.uniform(1.5, 2.5, len(values))  # feature c fires on category c
    X = A @ W + 0.05 * rng.normal(size=(len(values), D))
    fit = search_concept(X, A, values, W, "categories", n_cat)
    assert set(fit.features.filter(fit.features["selective"])["latent"].to_list()) == set(range(n_cat))
    assert sorted(fit.span.latents) == list(range(n_cat))  # differences of 4 general directions need all 4
    assert fit.fit["lda_accuracy"] > 0.95 and fit.fit["chance"] == 0.25


def test_greedy_span_stops_when_nothing_adds_variance():
    M = np.zeros((3, 4))
    M[:, 0] = [1, -1, 0]
    W = np.eye(4)
    span = greedy_span(M, W, np.arange(4))
    assert span.latents == [0] and span.explained == [pytest.approx(1.0)]


def test_concept_search_bad_input():
    p = planted_circle(7)
    with pytest.raises(InvalidInputError, match="kind"):
        search_concept(p["X"], p["A"], p["values"], p["W"], "spiral", 7)
    with pytest.raises(InvalidInputError, match="decoder"):
        search_concept(p["X"], p["A"], p["values"], p["W"][:5], "ordered", 7)
    assert concept_features(np.zeros((4, 3)), np.array([0, 0, 1, 1])).height == 0


def test_categories_with_too_few_prompts_say_why():
    from sae_atlas.geometry.concept_search import span_fit

    fit = span_fit(np.eye(6, 4), np.array([0, 1, 2, 0, 1, 2]), np.eye(4)[:, :2], "categories", 3)
    assert fit["score"] is None and "at least 3 prompts" in fit["note"]


def test_a_span_without_variation_says_why_instead_of_failing():
    from sae_atlas.geometry.concept_search import span_fit

    fit = span_fit(np.ones((14, 4)), np.arange(14) % 7, np.eye(4)[:, :2], "ordered", 7)
    assert fit["score"] is None and "fewer than 2 dimensions" in fit["note"]
