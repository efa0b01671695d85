"""The causal inner product from a model's unembedding (Park et al. 2024, "The Linear
Representation Hypothesis and the Geometry of Large Language Models").

With unembedding rows `gamma [V, d]`, their mean and covariance `Cov`, the causal basis is
`g(y) = A (gamma(y) - mean)` with `A = Cov^{-1/2}` (symmetric square root from an
eigendecomposition whose eigenvalues are floored at `floor * max eigenvalue`). Residual
("embedding") vectors such as SAE decoder rows map into the same space by `A^{-T} x`, so
Euclidean cosines there are causal cosines. `metric="euclidean"` keeps the centring and
uses the identity instead of `A`, which is the unwhitened baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from sae_atlas.errors import InvalidInputError

Metric = Literal["causal", "euclidean"]
METRICS: tuple[Metric, ...] = get_args(Metric)


@dataclass
class CausalBasis:
    """A linear frame for unembedding vectors (`unembed`) and residual vectors (`embed`)."""

    metric: Metric
    mean_D: np.ndarray
    A_DD: np.ndarray  # acts on row vectors: g = (gamma - mean) @ A
    A_inv_DD: np.ndarray  # residual vectors: l = x @ A_inv (A symmetric, so A^{-T} = A^{-1})
    eigenvalues_D: np.ndarray
    n_floored: int

    @property
    def d(self) -> int:
        return int(self.mean_D.shape[0])

    def unembed(self, gamma_VD: np.ndarray) -> np.ndarray:
        """Unembedding rows `[V, d]` in the basis: `(gamma - mean) @ A` (float64)."""
        gamma = _check_rows(gamma_VD, self.d, "unembedding rows")
        return (gamma - self.mean_D) @ self.A_DD

    def embed(self, x_ND: np.ndarray) -> np.ndarray:
        """Residual-stream vectors `[N, d]` (decoder rows, probe directions) in the basis."""
        return _check_rows(x_ND, self.d, "residual vectors") @ self.A_inv_DD


def _check_rows(X: np.ndarray, d: int | None, what: str) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0 or (d is not None and X.shape[1] != d):
        want = f"[N, {d}]" if d is not None else "[N, d]"
        raise InvalidInputError(f"{what} must be a non-empty 2-D array {want}, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise InvalidInputError(f"{what} contain NaN or infinite values")
    return X


def unembedding_rows(W_U_DV: np.ndarray) -> np.ndarray:
    """TransformerLens' `W_U [d_model, d_vocab]` as unembedding rows `gamma [V, d]`."""
    W = np.asarray(W_U_DV.detach().cpu() if hasattr(W_U_DV, "detach") else W_U_DV)
    if W.ndim != 2:
        raise InvalidInputError(f"W_U must be 2-D [d_model, d_vocab], got shape {W.shape}")
    return np.ascontiguousarray(W.T, dtype=np.float64)


def causal_basis(gamma_VD: np.ndarray, *, metric: Metric = "causal", floor: float = 1e-6) -> CausalBasis:
    """The causal (whitened) or Euclidean (centred only) basis of unembedding rows `[V, d]`.

    Eigenvalues of the covariance below `floor` times the largest are raised to that
    value before inverting, so near-singular unembeddings stay finite; `n_floored`
    says how many were.
    """
    if metric not in METRICS:
        raise InvalidInputError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    if not 0 < floor < 1:
        raise InvalidInputError(f"eigenvalue floor must be in (0, 1), got {floor}")
    gamma = _check_rows(gamma_VD, None, "unembedding rows")
    if gamma.shape[0] < 2:
        raise InvalidInputError("need at least 2 unembedding rows to estimate a covariance")
    mean = gamma.mean(axis=0)
    centred = gamma - mean
    cov = centred.T @ centred / gamma.shape[0]
    evals, evecs = np.linalg.eigh(cov)
    top = max(float(evals[-1]), np.finfo(np.float64).tiny)
    floored = np.maximum(evals, floor * top)
    d = gamma.shape[1]
    if metric == "euclidean":
        A, A_inv = np.eye(d), np.eye(d)
    else:
        A = (evecs / np.sqrt(floored)) @ evecs.T
        A_inv = (evecs * np.sqrt(floored)) @ evecs.T
    return CausalBasis(
        metric=metric,
        mean_D=mean,
        A_DD=A,
        A_inv_DD=A_inv,
        eigenvalues_D=evals[::-1].copy(),
        n_floored=int((evals < floor * top).sum()),
    )


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two vectors (0.0 when either is zero)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))
