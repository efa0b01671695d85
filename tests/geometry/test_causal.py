"""Causal basis: whitening, eigenvalue floor, residual-side map, concept-vector checks."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.causal import causal_basis, cosine, unembedding_rows
from sae_atlas.geometry.concept_vectors import concept_vector, fit_concepts, projections


def test_whitening_and_embed_pairing():
    rng = np.random.default_rng(0)
    gamma = rng.normal(size=(4000, 8)) @ np.diag(np.logspace(-1, 1, 8)) + 3.0
    basis = causal_basis(gamma)
    g = basis.unembed(gamma)
    np.testing.assert_allclose(g.mean(0), 0, atol=1e-9)
    np.testing.assert_allclose(g.T @ g / len(g), np.eye(8), atol=1e-8)
    # unembedding . residual inner products are preserved: g(y) . l(x) = (gamma(y) - mean) . x
    x = rng.normal(size=(5, 8))
    np.testing.assert_allclose(g[:10] @ basis.embed(x).T, (gamma[:10] - basis.mean_D) @ x.T, atol=1e-8)
    eu = causal_basis(gamma, metric="euclidean")
    np.testing.assert_allclose(eu.unembed(gamma), gamma - gamma.mean(0))
    # W_U [d, V] in TransformerLens orientation
    np.testing.assert_array_equal(unembedding_rows(gamma.T), gamma)


def test_eigenvalue_floor_keeps_singular_unembedding_finite():
    rng = np.random.default_rng(1)
    gamma = rng.normal(size=(500, 3)) @ rng.normal(size=(3, 6))  # rank 3 in d=6
    basis = causal_basis(gamma, floor=1e-4)
    assert basis.n_floored == 3
    assert np.isfinite(basis.unembed(gamma)).all()
    with pytest.raises(InvalidInputError):
        causal_basis(gamma, metric="cosine")
    with pytest.raises(InvalidInputError):
        causal_basis(gamma[:, :, None])
    with pytest.raises(InvalidInputError):
        basis.embed(np.ones((2, 5)))


def test_concept_vector_projection_checks():
    rng = np.random.default_rng(2)
    g = rng.normal(size=(5000, 16))
    direction = np.zeros(16)
    direction[0] = 2.0
    g[:200] = direction + 0.3 * rng.normal(size=(200, 16))
    fits = fit_concepts(g, {"c": np.arange(200)}, heldout_frac=0.25, seed=0)
    assert fits["c"].heldout_projection == pytest.approx(1.0, abs=0.1)
    assert abs(fits["c"].random_projection) < 0.05
    assert cosine(fits["c"].vector_D, direction) > 0.99
    np.testing.assert_allclose(concept_vector(g[:5], estimator="mean"), g[:5].mean(0))
    assert projections(g[:3], np.zeros(16)).tolist() == [0, 0, 0]
    with pytest.raises(InvalidInputError):
        fit_concepts(g, {"tiny": np.array([1, 2])})
    with pytest.raises(InvalidInputError):
        concept_vector(g[:5], estimator="median")
