"""Circle probe and circle-subspace replacement (Engels et al. 2024, section 4).

`fit_circle_probe` takes activations `X [N, d]` at a concept token with integer concept
values `a in [0, p)`, projects them on their top principal components `Z`, and fits
`P = argmin ||[Z, 1] P - [cos 2 pi a / p, sin 2 pi a / p]||` by least squares. It reports
the in-sample and leave-one-out R^2 and a label-permutation null (with few values, e.g. 7
days, 5 PCs + intercept fit almost any assignment of angles, so R^2 alone proves little).

The circular order is read without supervision: the per-value mean activations are
projected on their own top-2 principal components, and the values sorted by angle there
must form a rotation of 0..p-1 (or its reverse). The fitted period is the one whose
linear phase `2 pi a / period` best explains those angles (a periodogram over frequency).

For interventions the probe also carries the circle plane `U [d, 2]` (an orthonormal basis
of the directions the probe reads) and a generative fit of the plane coordinates,
`U^T (x - mean) ~ A [cos, sin] + c0`. `replace_on_circle` then moves a representation to
an angle in the CENTRED frame, `x' = x - U U^T (x - mean) + U c*(angle)`; mixing centred
and uncentred frames (a trap of the reference code) would shift every point by `U U^T mean`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.spectra import check_concept_values

TWO_PI = 2.0 * np.pi


@dataclass
class CircleProbe:
    """A fitted circle probe; arrays are float64, shapes in the suffixes."""

    period: int
    mean_D: np.ndarray  # activation mean
    components_KD: np.ndarray  # top principal directions (rows, orthonormal)
    explained_variance_ratio_K: np.ndarray
    coef_K1_2: np.ndarray  # [Z, 1] -> (cos, sin)
    plane_D2: np.ndarray  # orthonormal basis U of the directions the probe reads
    circle_A_22: np.ndarray  # U^T (x - mean) ~ A [cos, sin] + c0
    circle_c0_2: np.ndarray
    r2: float  # in-sample R^2 of the (cos, sin) targets
    r2_loo: float  # leave-one-out R^2
    r2_null: float  # mean in-sample R^2 with the values relabelled by random permutations
    value_angles_P: np.ndarray  # angle of each value's mean in the class-mean PC plane
    order: list[int]  # concept values sorted by that angle
    cyclic_order: bool  # order is a rotation of 0..p-1 or of its reverse
    adjacent_fraction: float  # share of angular neighbours that are concept neighbours
    fitted_period: float  # period whose linear phase best explains the angles
    period_fit: float  # resultant length in [0, 1] of that phase fit (1: exact)
    mean_plane_variance: float  # share of class-mean variance in their top-2 PCs
    r2_null_values: np.ndarray = field(default_factory=lambda: np.zeros(0))  # in-sample R^2 of each permutation

    @property
    def r2_p_value(self) -> float:
        """Permutation p-value of the in-sample R^2, `(1 + #{null >= r2}) / (1 + n_null)`
        (nan without null draws)."""
        n = len(self.r2_null_values)
        return float((1 + (self.r2_null_values >= self.r2).sum()) / (1 + n)) if n else float("nan")

    def scores(self, X_ND: np.ndarray) -> np.ndarray:
        """PCA scores `Z [N, K]` of activations in this probe's centred frame."""
        return (np.asarray(X_ND, dtype=np.float64) - self.mean_D) @ self.components_KD.T

    def predict(self, X_ND: np.ndarray) -> np.ndarray:
        """Probe output `[N, 2]` (approximately `(cos, sin)` of the concept angle)."""
        Z = self.scores(X_ND)
        return np.c_[Z, np.ones(len(Z))] @ self.coef_K1_2

    def decode_angle(self, X_ND: np.ndarray) -> np.ndarray:
        """Decoded concept angle in [0, 2 pi) per row."""
        out = self.predict(X_ND)
        return np.mod(np.arctan2(out[:, 1], out[:, 0]), TWO_PI)

    def decode_value(self, X_ND: np.ndarray) -> np.ndarray:
        """Decoded (continuous) concept value in [0, p) per row."""
        return self.decode_angle(X_ND) * self.period / TWO_PI

    def summary(self) -> dict[str, object]:
        """JSON-ready scalar summary."""
        return {
            "period": self.period,
            "r2": self.r2,
            "r2_loo": self.r2_loo,
            "r2_null": self.r2_null,
            "cyclic_order": self.cyclic_order,
            "adjacent_fraction": self.adjacent_fraction,
            "order": self.order,
            "fitted_period": self.fitted_period,
            "period_fit": self.period_fit,
            "mean_plane_variance": self.mean_plane_variance,
            "explained_variance_ratio": self.explained_variance_ratio_K.tolist(),
        }


def value_angle(values: np.ndarray, period: float) -> np.ndarray:
    """Angle `2 pi a / p` of concept values."""
    return TWO_PI * np.asarray(values, dtype=np.float64) / period


def _lstsq_r2(F: np.ndarray, T: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Least squares `F B ~ T`; returns B, in-sample R^2 and leave-one-out R^2."""
    B, *_ = np.linalg.lstsq(F, T, rcond=None)
    resid = T - F @ B
    sst = ((T - T.mean(0)) ** 2).sum()
    pinv = np.linalg.pinv(F)
    h = np.einsum("ij,ji->i", F, pinv)  # leverages (diagonal of the hat matrix)
    loo = resid / np.maximum(1.0 - h, 1e-9)[:, None]
    return B, float(1 - (resid**2).sum() / sst), float(1 - (loo**2).sum() / sst)


def circular_order(angles_P: np.ndarray) -> tuple[list[int], bool, float]:
    """Values (nan angles left out) sorted by angle; whether that is a rotation of 0..p-1 or of
    its reverse; and the share of angular neighbours that are concept neighbours."""
    present = np.flatnonzero(~np.isnan(angles_P))
    order = [int(v) for v in present[np.argsort(angles_P[present], kind="stable")]]
    p, m = len(angles_P), len(order)
    steps = [(order[(i + 1) % m] - order[i]) % p for i in range(m)] if m > 1 else []
    adjacent = float(np.mean([s in (1, p - 1) for s in steps])) if steps else 0.0
    cyclic = m == p and m > 2 and (all(s == 1 for s in steps) or all(s == p - 1 for s in steps))
    return order, cyclic, adjacent


def class_mean_angles(X_ND: np.ndarray, values_N: np.ndarray, period: int) -> tuple[np.ndarray, float]:
    """Angle of each value's mean activation in the top-2 PCs of the (centred) value means,
    nan for absent values; and the share of the means' variance in those 2 PCs."""
    present = np.unique(values_N)
    M = np.stack([X_ND[values_N == v].mean(0) for v in present])
    M = M - M.mean(0)
    _, s, Vt = np.linalg.svd(M, full_matrices=False)
    Z = M @ Vt[:2].T
    angles = np.full(period, np.nan)
    angles[present] = np.mod(np.arctan2(Z[:, 1], Z[:, 0]), TWO_PI)
    return angles, float((s[:2] ** 2).sum() / max((s**2).sum(), 1e-300))


def fit_period(angles_P: np.ndarray, n_grid: int = 2000) -> tuple[float, float]:
    """Period `q` maximising the resultant length `|mean_a exp(i (theta_a -/+ 2 pi a / q))|`
    over frequencies `1/q` in (0, 1/2] (both directions); returns `(q, resultant)`."""
    a = np.flatnonzero(~np.isnan(angles_P))
    th = angles_P[a]
    freqs = np.linspace(0.5 / n_grid, 0.5, n_grid)
    phase = TWO_PI * np.outer(freqs, a)
    res = np.maximum(
        np.abs(np.exp(1j * (th - phase)).mean(1)), np.abs(np.exp(1j * (th + phase)).mean(1))
    )
    best = int(np.argmax(res))
    return float(1.0 / freqs[best]), float(res[best])


def fit_circle_probe(
    X_ND: np.ndarray,
    values_N: np.ndarray,
    period: int,
    *,
    n_components: int = 5,
    n_null: int = 20,
    seed: int = 0,
) -> CircleProbe:
    """Fit a circle probe (see the module docstring) on the top `n_components` PCs; the
    null R^2 averages `n_null` seeded permutations of the value labels."""
    X, a = check_concept_values(X_ND, values_N, period)
    if X.shape[0] < 4:
        raise InvalidInputError(f"need at least 4 samples, got {X.shape[0]}")
    mean = X.mean(0)
    Xc = X - mean
    _, svals, Vt = np.linalg.svd(Xc, full_matrices=False)
    k = int(min(n_components, Vt.shape[0], X.shape[0] - 2))
    if k < 2 or svals[1] <= 1e-12 * max(svals[0], 1e-300):
        raise InvalidInputError("activations span fewer than 2 dimensions; no circle to fit")
    comps = Vt[:k]
    evr = svals[:k] ** 2 / (svals**2).sum()
    Z = Xc @ comps.T
    F = np.c_[Z, np.ones(len(Z))]
    theta = value_angle(a, period)
    coef, r2, r2_loo = _lstsq_r2(F, np.c_[np.cos(theta), np.sin(theta)])
    rng = np.random.default_rng(seed)
    null = []
    for _ in range(n_null):
        t = value_angle(rng.permutation(period)[a], period)
        null.append(_lstsq_r2(F, np.c_[np.cos(t), np.sin(t)])[1])

    W_D2 = comps.T @ coef[:k]  # directions the probe reads
    plane, _ = np.linalg.qr(W_D2)
    coords = Xc @ plane  # centred plane coordinates
    G = np.c_[np.cos(theta), np.sin(theta), np.ones(len(a))]
    gen, *_ = np.linalg.lstsq(G, coords, rcond=None)

    angles, plane_var = class_mean_angles(X, a, period)
    order, cyclic, adjacent = circular_order(angles)
    fitted, resultant = fit_period(angles)
    return CircleProbe(
        period=period,
        mean_D=mean,
        components_KD=comps,
        explained_variance_ratio_K=evr,
        coef_K1_2=coef,
        plane_D2=plane,
        circle_A_22=gen[:2].T,
        circle_c0_2=gen[2],
        r2=r2,
        r2_loo=r2_loo,
        r2_null=float(np.mean(null)) if null else float("nan"),
        value_angles_P=angles,
        order=order,
        cyclic_order=cyclic,
        adjacent_fraction=adjacent,
        fitted_period=fitted,
        period_fit=resultant,
        mean_plane_variance=plane_var,
        r2_null_values=np.asarray(null, dtype=np.float64),
    )


def circle_coords(probe: CircleProbe, angle_N: np.ndarray) -> np.ndarray:
    """Centred plane coordinates `c*(angle) = A [cos, sin] + c0` on the fitted circle, [N, 2]."""
    angle_N = np.asarray(angle_N, dtype=np.float64)
    return np.c_[np.cos(angle_N), np.sin(angle_N)] @ probe.circle_A_22.T + probe.circle_c0_2


def subspace_replace(
    X_ND: np.ndarray, basis_DK: np.ndarray, mean_D: np.ndarray, coords_NK: np.ndarray
) -> np.ndarray:
    """`x' = x - U U^T (x - mean) + U c` for an orthonormal basis `U [d, K]`, all in the
    centred frame: the subspace component of `x'` relative to `mean` becomes `c`."""
    X = np.asarray(X_ND, dtype=np.float64)
    U = np.asarray(basis_DK, dtype=np.float64)
    return X - ((X - mean_D) @ U) @ U.T + np.asarray(coords_NK, dtype=np.float64) @ U.T


def replace_on_circle(probe: CircleProbe, X_ND: np.ndarray, angle_N: np.ndarray) -> np.ndarray:
    """Move each row of `X_ND` to `angle_N` on the probe's fitted circle (centred frame)."""
    X = np.asarray(X_ND, dtype=np.float64)
    coords = circle_coords(probe, np.broadcast_to(angle_N, (X.shape[0],)))
    return subspace_replace(X, probe.plane_D2, probe.mean_D, coords)


def random_subspace(d: int, k: int, seed: int) -> np.ndarray:
    """A seeded random orthonormal basis `[d, k]` (QR of a Gaussian matrix)."""
    if not 0 < k <= d:
        raise InvalidInputError(f"subspace dimension must be in [1, {d}], got {k}")
    Q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, k)))
    return Q
