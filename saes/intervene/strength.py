"""Steering strength in interpretable units, and the sweep that calibrates it.

A steer edit adds `alpha * W_dec[f]` to the hook's output; a clamp edit sets the latent to
`value`. Beside the raw number, a strength is stated in two units:

- `act_multiple`: `alpha / mean_active_act_f`, multiples of the latent's typical active
  value (the summaries' `mean_active_act`);
- `norm_fraction`: `alpha * ||W_dec[f]|| / mean_resid_norm`, the fraction of the hook's
  mean residual norm the edit adds. The atlas records no residual norm for an imported
  SAE, so it is MEASURED here: the mean L2 norm of the hook's activations over the
  prompts the strength is calibrated on, BOS left out (its norm is an outlier).

Matched norms make directions of different kinds comparable (a feature, a difference of
means, a probe, a random feature): the same `norm_fraction` adds vectors of the same
length. `calibrate` picks, on a geometric grid of norm fractions measured in one batch,
the smallest strength whose measured probability ratio for the target reaches the
requested one while the KL on the rest of the distribution stays under a bound (the
"Eiffel Tower Llama" study finds useful strengths near half the typical norm; AxBench,
Wu et al. 2025, scores steering against fluency the same way).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.intervene.generate import generate_batch
from sae_atlas.saes.intervene.splice import Splice
from sae_atlas.saes.models import ModelHandle

StrengthUnit = Literal["alpha", "act_multiple", "norm_fraction"]
STRENGTH_UNITS: tuple[StrengthUnit, ...] = get_args(StrengthUnit)
MAX_NORM_FRACTION = 8.0
"""Largest strength as a fraction of the hook's mean residual norm (8x the stream itself)."""
MAX_ACT_MULTIPLE = 1000.0
MAX_RATIO = 1e4
"""Largest probability ratio a calibration may ask for."""
MAX_KL_BOUND = 20.0
"""Largest KL bound (nats) on the rest of the distribution."""


def check_bound(value: float, what: str, lo: float, hi: float) -> float:
    """`value` as a float if it is finite and in `(lo, hi]`, else InvalidInputError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not math.isfinite(value) or not lo < value <= hi:
        raise InvalidInputError(f"{what} must be a number in ({lo:g}, {hi:g}], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class StrengthScale:
    """How one direction's raw strength maps to interpretable units (module docstring)."""

    row_norm: float  # ||W_dec[f]|| (1 for a unit direction)
    resid_norm: float  # the hook's mean residual norm on the prompts
    mean_active_act: float | None = None  # the latent's typical active value; None: not a latent / dead

    def alpha(self, value: float, unit: StrengthUnit) -> float:
        """The raw `alpha` of a strength given in `unit` (checked against its bounds)."""
        if unit == "norm_fraction":
            return check_bound(value, "norm_fraction", 0.0, MAX_NORM_FRACTION) * self.resid_norm / self.row_norm
        if unit == "act_multiple":
            if not self.mean_active_act:
                raise InvalidInputError("act_multiple needs the latent's mean active value (it never fires "
                                        "in the summaries); give the strength as norm_fraction or alpha")
            return check_bound(value, "act_multiple", 0.0, MAX_ACT_MULTIPLE) * self.mean_active_act
        if unit == "alpha":
            limit = MAX_NORM_FRACTION * self.resid_norm / self.row_norm
            return check_bound(value, f"alpha (at most {MAX_NORM_FRACTION:g} x the residual norm)", 0.0, limit)
        raise InvalidInputError(f"unknown strength unit {unit!r}; valid: {', '.join(STRENGTH_UNITS)}")

    def units(self, alpha: float) -> dict[str, float | None]:
        """`alpha` in every unit: `{"alpha", "act_multiple", "norm_fraction"}`."""
        return {"alpha": float(alpha),
                "act_multiple": float(alpha / self.mean_active_act) if self.mean_active_act else None,
                "norm_fraction": float(alpha * self.row_norm / self.resid_norm)}


def geometric_grid(lo: float, hi: float, per_doubling: int = 2) -> np.ndarray:
    """Norm fractions from `lo` to `hi` (both within bounds), `per_doubling` per factor 2."""
    lo, hi = check_bound(lo, "lowest strength", 0.0, MAX_NORM_FRACTION), check_bound(hi, "highest strength", 0.0,
                                                                                     MAX_NORM_FRACTION)
    if hi < lo or per_doubling < 1:
        raise InvalidInputError(f"need lowest <= highest strength and >= 1 step per doubling, got {lo}, {hi}, "
                                f"{per_doubling}")
    n = int(math.floor(per_doubling * math.log2(hi / lo) + 1e-9)) + 1
    return lo * 2.0 ** (np.arange(n) / per_doubling)


def residual_norms(handle: ModelHandle, hook: str, prompts_PT: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The hook's mean residual norm over the prompts (BOS left out) and its clean
    activations at their last position `[P, D]` (float32, CPU)."""
    x_PTD = run_hooks(handle, prompts_PT, [handle.check_hook(hook)])[hook].float().cpu()
    return float(x_PTD[:, 1:].norm(dim=-1).mean()), x_PTD[:, -1]


@dataclass
class Calibration:
    """The strength `calibrate` chose: a norm fraction and what it measured there; `reached`
    is False when no grid strength reaches the ratio under the KL bound (then the strongest
    admissible point, or the weakest one when none is admissible)."""

    norm_fraction: float
    ratio: float
    kl_rest: float
    reached: bool
    best_ratio: float  # the largest ratio of a grid strength under the KL bound (1 when none)


def calibrate(fractions: np.ndarray, ratio_G: np.ndarray, kl_rest_G: np.ndarray, *, ratio: float,
              kl_bound: float) -> Calibration:
    """The smallest grid strength (`fractions`, ascending) whose measured ratio is at least
    `ratio` with `kl_rest <= kl_bound`."""
    ok = kl_rest_G <= kl_bound
    best = float(ratio_G[ok].max()) if ok.any() else 1.0
    hits = np.flatnonzero(ok & (ratio_G >= ratio))
    if hits.size:
        i = int(hits[0])
        return Calibration(float(fractions[i]), float(ratio_G[i]), float(kl_rest_G[i]), True, best)
    i = int(np.flatnonzero(ok)[np.argmax(ratio_G[ok])]) if ok.any() else 0
    return Calibration(float(fractions[i]), float(ratio_G[i]), float(kl_rest_G[i]), False, best)


def require_reached(cal: Calibration, what: str, *, ratio: float, kl_bound: float) -> Calibration:
    """`cal` if it reached the requested ratio, else InvalidInputError saying how far it got."""
    if not cal.reached:
        raise InvalidInputError(
            f"no strength up to {MAX_NORM_FRACTION:g} x the residual norm makes {what} reach a probability ratio "
            f"of {ratio:g} with KL on the rest of the distribution <= {kl_bound:g} nats (best under the bound: "
            f"{cal.best_ratio:.3g}x); ask for a smaller ratio or a larger KL bound")
    return cal


@torch.inference_mode()
def continuation_perplexity(handle: ModelHandle, prompts_PT: torch.Tensor, splices: Sequence[Splice],
                            n_tokens: int) -> np.ndarray:
    """Per splice, the clean model's perplexity of the greedy continuations (`n_tokens`
    each) the spliced model writes after every prompt: how fluent the steered text is, as
    the unsteered model reads it. One batch: prompts x splices (same SAEs in each)."""
    if n_tokens < 1:
        raise InvalidInputError(f"need at least one continuation token, got {n_tokens}")
    prompts = [p for _ in splices for p in prompts_PT]
    rows = generate_batch(handle, prompts, [s for s in splices for _ in prompts_PT], max_new_tokens=n_tokens,
                          stop_at_eos=False)
    ids_BT = torch.stack([torch.cat([p, torch.tensor(new, dtype=p.dtype)]) for p, (new, _) in zip(prompts, rows,
                                                                                                 strict=True)])
    logp = torch.log_softmax(handle.bridge(ids_BT.to(handle.device)).float(), -1)
    start = prompts_PT.shape[1]
    nll_BT = -logp[:, start - 1:-1].gather(-1, ids_BT[:, start:, None].to(logp.device))[..., 0]
    return nll_BT.mean(-1).view(len(splices), -1).mean(-1).exp().cpu().numpy()
