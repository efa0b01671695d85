"""Geometric median by Weiszfeld's algorithm (used to initialise `b_dec`)."""

from __future__ import annotations

import torch


def geometric_median(points_ND: torch.Tensor, *, max_iter: int = 100, tol: float = 1e-6) -> torch.Tensor:
    """The point minimising the sum of Euclidean distances to the rows of `points_ND`.

    Weiszfeld's iteration: re-weight each point by the inverse of its distance to the
    current estimate, starting from the mean; distances are floored so an estimate that
    lands on a data point stays finite. Stops when the relative step falls below `tol`.
    """
    points = points_ND.double()
    median = points.mean(0)
    for _ in range(max_iter):
        dist = (points - median).norm(dim=1).clamp_min(1e-8)
        weights = 1.0 / dist
        new = (weights[:, None] * points).sum(0) / weights.sum()
        moved = (new - median).norm() / median.norm().clamp_min(1e-12)
        median = new
        if moved < tol:
            break
    return median.to(points_ND.dtype)
