"""Typed feature edits and how each one changes an activation.

An edit names where it acts (`at`: every position, the last prompt token, a list of
prompt positions, or the prompt tokens matching a string) and what it does:

- `steer`: add `alpha * W_dec[feature]` to the hook's output;
- `clamp`: set the feature's activation to `value`; `scale`: multiply it by `factor`;
- `ablate`: set it to zero, or to its mean over the atlas's tokens (`to="mean"`);
- `project_out`: remove the span of several features' decoder rows from the output;
- `rotate`: move the representation on a fitted circle plane by `steps` values (or the
  random-plane / mean-ablation baselines); the plane comes from a stored circular concept
  run and is resolved by the caller into a `CirclePlane`.

Specs are plain frozen dataclasses (`api.operations.interventions` holds their request
models, which validate a JSON edit and build one); `compile_edit` turns one into a
`CompiledEdit` holding tensors, applied by `saes.intervene.splice`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError


@dataclass(frozen=True)
class TokenMatch:
    """Prompt positions whose token text, stripped of spaces, equals `match` stripped."""

    match: str


Positions = Literal["all", "last"] | list[int] | TokenMatch


@dataclass(frozen=True, kw_only=True)
class SteerEdit:
    """Add `alpha * W_dec[feature]` to the hook's output."""

    sae: str
    feature: int
    alpha: float
    at: Positions = "all"
    kind: Literal["steer"] = "steer"


@dataclass(frozen=True, kw_only=True)
class ClampEdit:
    """Set the feature's activation to `value`."""

    sae: str
    feature: int
    value: float
    at: Positions = "all"
    kind: Literal["clamp"] = "clamp"


@dataclass(frozen=True, kw_only=True)
class ScaleEdit:
    """Multiply the feature's activation by `factor`."""

    sae: str
    feature: int
    factor: float
    at: Positions = "all"
    kind: Literal["scale"] = "scale"


@dataclass(frozen=True, kw_only=True)
class AblateEdit:
    """Set the feature's activation to zero, or to its mean over the atlas's tokens."""

    sae: str
    feature: int
    to: Literal["zero", "mean"] = "zero"
    at: Positions = "all"
    kind: Literal["ablate"] = "ablate"


@dataclass(frozen=True, kw_only=True)
class ProjectOutEdit:
    """Remove the span of several features' decoder rows from the hook's output."""

    sae: str
    features: list[int]
    at: Positions = "all"
    kind: Literal["project_out"] = "project_out"


RotateBaseline = Literal["circle", "random_plane", "mean_ablation"]


@dataclass(frozen=True, kw_only=True)
class RotateEdit:
    """Move the representation `steps` values along a fitted circle (or a baseline)."""

    circle: str  # a stored `analyze circular concept` run
    layer: int | None = None  # probed layer (None: the run's best layer)
    steps: int = 1
    baseline: RotateBaseline = "circle"
    seed: int = 0
    at: Positions = "all"
    kind: Literal["rotate"] = "rotate"


Edit = SteerEdit | ClampEdit | ScaleEdit | AblateEdit | ProjectOutEdit | RotateEdit
EDIT_KINDS = ("steer", "clamp", "scale", "ablate", "project_out", "rotate")
FEATURE_KINDS = ("clamp", "scale", "ablate")  # act on the SAE code; the rest on the hook output


def edit_dict(spec: Edit) -> dict[str, Any]:
    """An edit as the JSON object `Atlas.run` / `Atlas.steer` take back."""
    return asdict(spec)


@dataclass
class CirclePlane:
    """A fitted circle in the residual stream (arrays from a stored concept run):
    centred plane coordinates `U^T (x - mean) ~ A [cos, sin] + c0`."""

    hook: str
    period: int
    mean_D: np.ndarray
    basis_D2: np.ndarray
    A_22: np.ndarray
    c0_2: np.ndarray


def resolve_positions(at: Positions, tokens: list[str], n_prompt: int, n_total: int) -> torch.Tensor:
    """Boolean mask `[n_total]` of the positions an edit acts on. `all` covers generated
    tokens too; `last`, indices and matches refer to the prompt (`n_prompt` tokens)."""
    mask = torch.zeros(n_total, dtype=torch.bool)
    if at == "all":
        mask[:] = True
    elif at == "last":
        mask[n_prompt - 1] = True
    elif isinstance(at, TokenMatch):
        hits = [i for i, t in enumerate(tokens[:n_prompt]) if t.strip() == at.match.strip()]
        if not hits:
            raise InvalidInputError(f"no prompt token matches {at.match!r}; tokens: {tokens[:n_prompt]}")
        mask[hits] = True
    else:
        bad = [i for i in at if not -n_prompt <= i < n_prompt]
        if bad:
            raise InvalidInputError(f"positions {bad} are outside the prompt's {n_prompt} tokens")
        mask[[i % n_prompt for i in at]] = True
    return mask


@dataclass
class CompiledEdit:
    """One edit ready to apply at `hook`: on the SAE code `f` (`FEATURE_KINDS`) or on the
    hook output `x`, at the positions in `mask_T` (`[N]`, or `[B, N]`: one row per batch row)."""

    spec: Any
    hook: str
    mask_T: torch.Tensor
    feature: int | None = None
    value: float = 0.0  # clamp/ablate target, scale factor, steer alpha
    vector_D: torch.Tensor | None = None  # steer direction
    basis_DK: torch.Tensor | None = None  # project_out / rotate plane (orthonormal)
    mean_D: torch.Tensor | None = None
    map_22: torch.Tensor | None = None  # rotate: centred coordinates -> new coordinates
    shift_2: torch.Tensor | None = None

    @property
    def on_code(self) -> bool:
        return self.spec.kind in FEATURE_KINDS

    def mask_at(self, n: int, positions: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """The mask at the `n` tokens a hook sees: positions `0..n-1`, or the absolute
        `positions` (`[n]` or `[B, n]`; negative marks padding, never edited)."""
        pos = torch.arange(n, device=device) if positions is None else positions.to(device)
        mask = self.mask_T.to(device)
        idx = pos.clamp_min(0)
        hit = mask[idx] if mask.ndim == 1 else mask.gather(-1, idx.expand(mask.shape[0], -1))
        return hit & (pos >= 0)

    def apply_code(self, f_TF: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The SAE code `[..., T, F]` with this clamp / scale / ablate applied (`positions`
        as in `mask_at`)."""
        m = self.mask_at(f_TF.shape[-2], positions, f_TF.device)
        col = f_TF[..., self.feature]
        new = col * self.value if self.spec.kind == "scale" else torch.full_like(col, self.value)
        f_TF = f_TF.clone()
        f_TF[..., self.feature] = torch.where(m, new, col)
        return f_TF

    def apply_output(self, x_TD: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The hook output `[..., T, D]` with this steer / project-out / rotate applied
        (`positions` as in `mask_at`)."""
        m = self.mask_at(x_TD.shape[-2], positions, x_TD.device).unsqueeze(-1)
        if self.vector_D is not None:
            return x_TD + m * (self.value * self.vector_D.to(x_TD))
        U = self.basis_DK.to(x_TD)
        mean = torch.zeros_like(U[:, 0]) if self.mean_D is None else self.mean_D.to(x_TD)
        coords = (x_TD - mean) @ U
        new = torch.zeros_like(coords) if self.map_22 is None else coords @ self.map_22.to(x_TD).T + self.shift_2.to(x_TD)
        return x_TD + m * ((new - coords) @ U.T)


def _orthonormal(M_DK: torch.Tensor) -> torch.Tensor:
    Q, R = torch.linalg.qr(M_DK.double())
    keep = R.diagonal().abs() > 1e-8 * R.diagonal().abs().max().clamp_min(1e-30)
    return Q[:, keep].float()


def rotation_map(plane: CirclePlane, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Affine map of centred plane coordinates that moves a point on the fitted ellipse
    `A [cos t, sin t] + c0` to angle `t + 2 pi steps / period` (off-circle residue kept)."""
    theta = 2 * math.pi * steps / plane.period
    R = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    A = np.asarray(plane.A_22, dtype=np.float64)
    if abs(np.linalg.det(A)) < 1e-12:
        raise InvalidInputError("the fitted circle is degenerate (its map A is singular); refit the concept run")
    M = A @ R @ np.linalg.inv(A)
    shift = plane.c0_2 - M @ plane.c0_2
    return torch.tensor(M, dtype=torch.float32), torch.tensor(shift, dtype=torch.float32)


def compile_edit(
    spec: Any,
    mask_T: torch.Tensor,
    *,
    sae: Any = None,
    hook: str,
    feature_mean: float | None = None,
    plane: CirclePlane | None = None,
) -> CompiledEdit:
    """A `CompiledEdit` for a validated spec: `sae` for feature edits (the feature index is
    checked against it), `feature_mean` for `ablate to=mean`, `plane` for `rotate`."""
    kind = spec.kind
    if kind == "rotate":
        if plane is None:
            raise InvalidInputError("a rotate edit needs the circle plane of its concept run")
        U = torch.tensor(plane.basis_D2, dtype=torch.float32)
        mean = torch.tensor(plane.mean_D, dtype=torch.float32)
        if spec.baseline == "mean_ablation":
            return CompiledEdit(spec, hook, mask_T, basis_DK=U, mean_D=mean)
        M, shift = rotation_map(plane, spec.steps)
        if spec.baseline == "random_plane":  # a seeded random plane, rotated by the same angle
            g = torch.Generator().manual_seed(spec.seed)
            U = _orthonormal(torch.randn(U.shape[0], 2, generator=g))
            theta = 2 * math.pi * spec.steps / plane.period
            M = torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
            shift = torch.zeros(2)
        return CompiledEdit(spec, hook, mask_T, basis_DK=U, mean_D=mean, map_22=M, shift_2=shift)
    if sae is None:
        raise InvalidInputError(f"a {kind} edit needs its SAE")
    d_sae = int(sae.W_dec.shape[0])
    feats = spec.features if kind == "project_out" else [spec.feature]
    bad = [i for i in feats if not 0 <= i < d_sae]
    if bad:
        raise InvalidInputError(f"features {bad} out of range for SAE {spec.sae!r}: valid 0..{d_sae - 1}")
    W_dec = sae.W_dec.detach().float()
    if kind == "steer":
        return CompiledEdit(spec, hook, mask_T, feature=spec.feature, value=spec.alpha, vector_D=W_dec[spec.feature])
    if kind == "project_out":
        return CompiledEdit(spec, hook, mask_T, basis_DK=_orthonormal(W_dec[spec.features].T))
    if kind == "clamp":
        return CompiledEdit(spec, hook, mask_T, feature=spec.feature, value=spec.value)
    if kind == "scale":
        return CompiledEdit(spec, hook, mask_T, feature=spec.feature, value=spec.factor)
    if kind == "ablate":
        if spec.to == "mean" and feature_mean is None:
            raise InvalidInputError(f"ablate to=mean needs the mean activation of {spec.sae}/{spec.feature} "
                                    "(summarize the SAE first)")
        return CompiledEdit(spec, hook, mask_T, feature=spec.feature,
                            value=float(feature_mean) if spec.to == "mean" else 0.0)
    raise InvalidInputError(f"unknown edit kind {kind!r}; valid: {', '.join(EDIT_KINDS)}")
