"""The per-layer ID / LID shift between two models on paired tokens: a layer planted as
compressed in B (projected onto 3 of its 8 manifold dimensions) shifts down with a tiny
p-value; layers B computes as A does shift by exactly 0 with p = 1; two independent draws of
one distribution sit at the null."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.depth_shift import depth_shift_table, paired_shift


def manifold(n: int, d: int, D: int = 32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, D)) + 0.01 * rng.normal(size=(n, D))


def test_a_compressed_layer_shifts_down_and_unchanged_layers_do_not():
    A = np.stack([manifold(600, 8, seed=s) for s in range(3)], axis=1)  # [600, 3, 32]
    B = A.copy()
    rng = np.random.default_rng(9)
    basis = np.linalg.qr(rng.normal(size=(32, 3)))[0]
    B[:, 1] = A[:, 1] @ basis @ basis.T + 0.01 * rng.normal(size=(600, 32))  # layer 1 compressed to ~3 dims
    table = depth_shift_table(A, B, [4, 5, 6], k=10, mle_k=10, n_boot=100, n_permutations=200)
    assert table["layer"].to_list() == [4, 5, 6]
    planted = table.row(1, named=True)
    assert planted["mle_a"] > 6 and planted["mle_b"] < 4.5 and planted["mle_shift"] < -2
    assert planted["mle_shift_high"] < 0 and planted["lid_shift_high"] < 0
    assert planted["mle_shift_p"] < 0.01 and planted["lid_shift_p"] < 0.01 and planted["twonn_b"] < planted["twonn_a"]
    for same in (table.row(0, named=True), table.row(2, named=True)):
        assert same["mle_shift"] == same["lid_shift"] == 0.0 and same["mle_shift_p"] == same["lid_shift_p"] == 1.0


def test_independent_draws_of_one_distribution_sit_at_the_null():
    a, b = (1.0 / np.random.default_rng(s).uniform(4, 6, size=500) for s in (1, 2))
    s = paired_shift(a, b, "inverse_mean", n_permutations=500)
    assert s.low < 0 < s.high and s.p_value > 0.05 and abs(s.shift) < 0.3


def test_unpaired_inputs_are_clear_errors():
    with pytest.raises(InvalidInputError, match="same tokens"):
        depth_shift_table(np.zeros((10, 3, 4)), np.zeros((9, 3, 4)), [0, 1, 2])
    with pytest.raises(InvalidInputError, match="equal-length"):
        paired_shift(np.ones(3), np.ones(4), "mean")
