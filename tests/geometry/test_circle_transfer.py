"""A circle planted in A and in a rotated B is found in B (R^2 near 1, A's order and
period); a B without it scores at its null; A's probe read unchanged only works where B
keeps A's coordinates."""

from __future__ import annotations

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.circle_transfer import SideActivations, circle_transfer, same_cycle
from sae_atlas.geometry.figures_circular import circle_transfer_figure

DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
P, REPEATS, D, F = 7, 7, 64, 40


def _planted(seed: int, circle: bool = True) -> tuple[SideActivations, np.ndarray]:
    """SAE codes with one feature per day whose decoder rows lie on a circle (plus 33
    random features), and activations decoded from them with noise."""
    rng = np.random.default_rng(seed)
    values = np.tile(np.arange(P), REPEATS)
    W = rng.normal(size=(F, D)) / np.sqrt(D)
    theta = 2 * np.pi * np.arange(P) / P
    if circle:
        W[:P] = 0.0
        W[:P, 0], W[:P, 1], W[:P, 2] = 2 * np.cos(theta), 2 * np.sin(theta), 1.0
    codes = 0.3 * np.abs(rng.normal(size=(len(values), F))) * (rng.random((len(values), F)) < 0.2)
    if circle:
        codes[:, :P] = 0.0
        codes[np.arange(len(values)), values] = 1.0 + 0.1 * rng.random(len(values))
    X = codes @ W + 0.05 * rng.normal(size=(len(values), D))
    return SideActivations(X, codes, W), values


def _rotated(side: SideActivations, seed: int) -> SideActivations:
    R, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(D, D)))
    perm = np.random.default_rng(seed).permutation(F)
    return SideActivations(side.X_ND @ R, side.codes_NF[:, perm], side.W_dec_FD[perm] @ R)


def _rows(result) -> dict[str, dict]:
    return {f"{r['side']}_{r['space']}": r for r in result.table.iter_rows(named=True)}


def test_a_circle_in_a_rotated_b_is_found_with_the_same_order_and_period():
    a, values = _planted(0)
    result = circle_transfer(a, _rotated(a, 1), values, DAYS, n_null=100, n_random=20)
    rows = _rows(result)
    for key in ("A_residual", "B_residual", "A_span", "B_span"):
        r = rows[key]
        assert r["r2"] > 0.95 and r["p_value"] < 0.05, (key, r)
        assert r["cyclic_order"] and r["order_matches_a"] and abs(r["fitted_period"] - P) < 0.2
        assert set(r["order"]) == set(DAYS)
    assert rows["B_span"]["dimension"] >= 2 and rows["B_span"]["null_mean"] < rows["B_span"]["r2_loo"] - 0.2
    assert rows["B_a_probe"]["r2"] < 0.5  # rotated: A's probe does not read B's coordinates
    assert result.summary["found_in_b"] and result.summary["fits"]["B_residual"]["order_matches_a"]
    fig = circle_transfer_figure(result.outputs, values, DAYS, rows)
    assert [ax.get_title()[:10] for ax in fig.axes] == ["A residual", "B residual", "B a probe:"]


def test_a_fine_tuned_b_in_a_s_coordinates_reads_a_s_probe():
    a, values = _planted(0)
    b = SideActivations(a.X_ND + 0.05 * np.random.default_rng(3).normal(size=a.X_ND.shape), a.codes_NF, a.W_dec_FD)
    rows = _rows(circle_transfer(a, b, values, DAYS, n_null=50, n_random=10))
    assert rows["B_a_probe"]["r2"] > 0.9 and rows["B_a_probe"]["p_value"] < 0.05
    assert rows["B_a_probe"]["order_matches_a"] and rows["B_a_span"]["r2"] > 0.9


def test_a_b_without_the_circle_scores_at_its_null():
    a, values = _planted(0)
    b, _ = _planted(6, circle=False)
    result = circle_transfer(a, b, values, DAYS, n_null=100, n_random=20)
    rows = _rows(result)
    assert rows["B_residual"]["p_value"] > 0.1
    assert abs(rows["B_residual"]["r2"] - rows["B_residual"]["null_mean"]) < 0.15
    assert rows["B_a_probe"]["r2"] < 0.3 and rows["B_a_probe"]["p_value"] > 0.05
    assert not result.summary["found_in_b"]


def test_same_cycle_accepts_rotations_and_reflections_only():
    assert same_cycle([0, 1, 2, 3], [2, 3, 0, 1]) and same_cycle([0, 1, 2, 3], [1, 0, 3, 2])
    assert not same_cycle([0, 1, 2, 3], [0, 2, 1, 3]) and not same_cycle([0, 1, 2], [0, 1])


def test_mismatched_rows_are_refused():
    a, values = _planted(0)
    with pytest.raises(InvalidInputError, match="rows"):
        circle_transfer(a, SideActivations(a.X_ND[:10]), values, DAYS)
