"""The trajectory of each token's state across layers: a forward pass read as a path
`h_0, h_1, ..., h_{L-1}` in the residual space.

Per token: steps `h_{l+1} - h_l` and their lengths; curvature as the turning angle between
successive steps (0 on a straight path, pi/2 at a right-angle turn, NaN where a step has
zero length); the cosine of consecutive states; the cosine of each state to the final one;
and a convergence index, the mean of that cosine over the layers before the last (1 when
the state points its final way from the first layer on, lower the later it turns there).

Residual streams grow in norm with depth, so `space` says what is measured: the raw states,
or states scaled to unit norm first (then step lengths are chord lengths on the sphere).
Cosines and angles do not depend on it except through the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from sae_atlas.errors import InvalidInputError

TrajectorySpace = Literal["raw", "unit"]


@dataclass
class Trajectories:
    """Per-token trajectory geometry of `N` tokens over `L` layers."""

    space: TrajectorySpace
    step_length: np.ndarray  # [N, L-1]
    curvature: np.ndarray  # [N, L-2], radians in [0, pi]; NaN where a step is zero
    consecutive_cosine: np.ndarray  # [N, L-1]: cos(h_l, h_{l+1})
    cosine_to_final: np.ndarray  # [N, L]: cos(h_l, h_{L-1})
    convergence_index: np.ndarray  # [N]: mean of cosine_to_final over layers 0..L-2


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip((a * b).sum(-1) / (na * nb), -1.0, 1.0)


def trajectory_geometry(states_NLD: np.ndarray, *, space: TrajectorySpace = "raw") -> Trajectories:
    """Trajectory geometry of `states_NLD` (`N` tokens, `L >= 3` layers in depth order,
    `D` dimensions), measured on the `space` ('raw' or 'unit') states."""
    H = np.asarray(states_NLD, dtype=np.float64)
    if H.ndim != 3 or H.shape[1] < 3:
        raise InvalidInputError(f"trajectories need states [tokens, layers >= 3, d], got shape {H.shape}")
    if space not in ("raw", "unit"):
        raise InvalidInputError(f"unknown trajectory space {space!r}; valid: raw, unit")
    if space == "unit":
        norms = np.linalg.norm(H, axis=-1, keepdims=True)
        H = H / np.where(norms > 0, norms, 1.0)
    steps = np.diff(H, axis=1)
    cos_final = _cosine(H, H[:, -1:, :])
    return Trajectories(
        space=space,
        step_length=np.linalg.norm(steps, axis=-1),
        curvature=np.arccos(_cosine(steps[:, :-1], steps[:, 1:])),
        consecutive_cosine=_cosine(H[:, :-1], H[:, 1:]),
        cosine_to_final=cos_final,
        convergence_index=cos_final[:, :-1].mean(axis=1),
    )
