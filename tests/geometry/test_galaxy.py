"""Galaxy: planted power-law spectra and planted manifolds of known dimension."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.galaxy import covariance_spectrum, power_law_fit
from sae_atlas.geometry.intrinsic_dimension import twonn_dimension


def planted_spectrum(alpha, n=20000, d=256, seed=0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    scale = np.arange(1, d + 1) ** (-alpha / 2)
    return (rng.normal(size=(n, d)) * scale) @ Q.T


@pytest.mark.parametrize("alpha", [0.25, 0.5, 1.0])
def test_power_law_slope_recovered(alpha):
    fit = power_law_fit(covariance_spectrum(planted_spectrum(alpha)))
    assert fit.alpha == pytest.approx(alpha, abs=0.05)
    assert fit.slope == pytest.approx(-fit.alpha) and fit.r2 > 0.98 and (fit.lo, fit.hi) == (10, 150)


def test_steeper_spectrum_has_larger_alpha():
    flat, steep = (power_law_fit(covariance_spectrum(planted_spectrum(a, n=4000))) for a in (0.25, 0.5))
    assert steep.alpha > flat.alpha
    with pytest.raises(InvalidInputError):
        power_law_fit(np.ones(11))


def test_twonn_on_planted_manifolds():
    rng = np.random.default_rng(0)
    n = 4000
    plane = rng.normal(size=(n, 2)) @ rng.normal(size=(2, 20))
    gauss5 = rng.normal(size=(n, 5)) @ np.linalg.qr(rng.normal(size=(30, 5)))[0].T
    t = rng.uniform(1.5 * np.pi, 4.5 * np.pi, n)
    roll = np.stack([t * np.cos(t), rng.uniform(0, 20, n), t * np.sin(t)], 1)
    sphere = rng.normal(size=(n, 9))
    sphere /= np.linalg.norm(sphere, axis=1, keepdims=True)  # an 8-dimensional sphere in R^9
    for X, true in ((plane, 2), (gauss5, 5), (roll, 2), (sphere, 8)):
        assert twonn_dimension(X).dimension == pytest.approx(true, rel=0.15)
    dup = np.concatenate([plane, plane[:100]])  # duplicates are dropped, not fatal
    assert twonn_dimension(dup).dimension == pytest.approx(2, rel=0.15)
