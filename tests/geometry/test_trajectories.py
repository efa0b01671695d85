"""Trajectory geometry on planted paths: straight lines, right-angle turns, convergence."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.trajectories import trajectory_geometry


def test_straight_line_has_zero_curvature_and_equal_steps():
    rng = np.random.default_rng(0)
    start, v = rng.normal(size=(5, 1, 16)), rng.normal(size=(5, 1, 16))
    H = start + np.arange(6)[None, :, None] * v  # 5 tokens, 6 layers, 16 dims
    t = trajectory_geometry(H)
    assert t.curvature.shape == (5, 4) and np.allclose(t.curvature, 0.0, atol=1e-6)
    assert np.allclose(t.step_length, np.linalg.norm(v, axis=-1))
    assert t.cosine_to_final.shape == (5, 6) and np.allclose(t.cosine_to_final[:, -1], 1.0)


def test_right_angle_turn_is_half_pi():
    e = np.eye(4)
    H = np.stack([np.zeros(4) + 1, 1 + e[0], 1 + e[0] + 2 * e[1], 1 + e[0] + 2 * e[1] + 3 * e[1]])[None]
    t = trajectory_geometry(H)
    assert t.curvature[0] == pytest.approx([np.pi / 2, 0.0], abs=1e-9)
    assert t.step_length[0] == pytest.approx([1.0, 2.0, 3.0])


def test_convergence_index_orders_early_and_late_settling_tokens():
    e = np.eye(3)
    early = np.stack([e[0], e[0], e[0], 2 * e[0]])  # points its final way from the start
    late = np.stack([e[1], e[1], e[1], e[0]])  # turns there only at the last layer
    t = trajectory_geometry(np.stack([early, late]))
    assert t.convergence_index == pytest.approx([1.0, 0.0])
    assert t.consecutive_cosine[1] == pytest.approx([1.0, 1.0, 0.0])
    unit = trajectory_geometry(np.stack([early, late]), space="unit")
    assert unit.step_length[0] == pytest.approx([0.0, 0.0, 0.0]) and np.isnan(unit.curvature[0]).all()


def test_bad_shapes_and_space_are_clear_errors():
    with pytest.raises(InvalidInputError, match="layers >= 3"):
        trajectory_geometry(np.zeros((4, 2, 3)))
    with pytest.raises(InvalidInputError, match="valid: raw, unit"):
        trajectory_geometry(np.zeros((4, 3, 3)), space="log")
