"""The misload guard: judge an imported SAE on real activations of its hook.

An SAE read with a wrong convention still loads and runs; only its numbers give it away.
`check_sae` measures FVU, L0 and the dead fraction on activation rows of the target hook
and names the likely cause of a failure by trying the usual mistakes and keeping the one
that fixes the reconstruction:

- `threshold`: an SAE with a learned threshold (`SAE.has_threshold`: JumpReLU, BatchTopK,
  Matryoshka) firing on a large share of its latents (a lost threshold lets every positive
  pre-activation through, about d_sae / 2);
- `l0`: L0 far (over 3x) from the release's recorded L0 or, for an architecture whose `k`
  is its mean L0 (`SAE.k_is_mean_l0`), the config's k;
- `transposed`: a square SAE reconstructs much better once `W_enc` and `W_dec` are swapped
  and transposed (a non-square one fails the readers' shape checks, which say so);
- `apply_b_dec_to_input`: it reconstructs once the input bias convention is flipped;
- `normalisation`: it reconstructs once inputs are rescaled (a missing or wrong
  `expected_average_only_in` factor); the factor that works is reported;
- `hook`: it reconstructs another cached hook of the same width much better;
- `fvu`: it reconstructs worse than the mean (FVU > 1) for no reason found above;
- `dead`: no latent fires at all.

A transcoder is judged on paired rows (`saes.train.paired_rows`): how well it predicts its
output hook from its input hook; the bias-convention flip and the other-hook check do not
apply to it (its `b_dec` is an output bias).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.train.paired_rows import input_and_target
from sae_atlas.saes.train.reconstruction import ReconstructionStats

Cause = Literal["threshold", "l0", "transposed", "normalisation", "apply_b_dec_to_input", "hook", "fvu", "dead"]
MAX_FVU = 1.0
L0_FACTOR = 3.0
DENSE_SHARE = 0.25
DIAGNOSIS_TOKENS = 1024
_SCALES = [2.0**j for j in range(-12, 13) if j != 0]


@dataclass
class Problem:
    """One reason to distrust an imported SAE."""

    cause: Cause
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@torch.no_grad()
def _fvu(sae: SAE, rows: torch.Tensor, scale: float = 1.0) -> float:
    """FVU of `sae` on `rows`; with `scale`, of the SAE with that input scale folded in
    (`x_hat(scale * x) / scale`, exactly what folding it into the weights gives)."""
    x, target = input_and_target(sae.cfg, rows)
    stats = ReconstructionStats(sae.cfg.output_dim, sae.cfg.d_sae)
    out = sae((x * scale).to(sae.W_enc.dtype))
    stats.update(target, out.x_hat.float() / scale, out.feature_acts)
    return float(stats.result()["fvu"])


def _transposed(sae: SAE) -> SAE | None:
    """A copy of a square SAE with `W_enc` and `W_dec` swapped and transposed (else None)."""
    if sae.cfg.d_in != sae.cfg.d_sae:
        return None  # non-square: the readers' shape checks already name a transposition
    other = copy.deepcopy(sae)
    with torch.no_grad():
        other.W_enc.copy_(sae.W_dec.T)
        other.W_dec.copy_(sae.W_enc.T)
    return other


def _bias_flipped_fvu(sae: SAE, rows: torch.Tensor) -> float:
    """FVU with the other `apply_b_dec_to_input` convention (the config is restored)."""
    sae.cfg.apply_b_dec_to_input = not sae.cfg.apply_b_dec_to_input
    try:
        return _fvu(sae, rows)
    finally:
        sae.cfg.apply_b_dec_to_input = not sae.cfg.apply_b_dec_to_input


def _good(fvu: float, baseline: float) -> bool:
    return fvu < min(MAX_FVU, 0.5 * baseline)


def _diagnose_fvu(sae: SAE, rows: torch.Tensor, fvu: float, other_hooks: dict[str, torch.Tensor],
                  hook: str) -> Problem:
    sample = rows[:DIAGNOSIS_TOKENS]
    flipped = math.inf if sae.is_transcoder else _bias_flipped_fvu(sae, sample)
    if _good(flipped, fvu):
        return Problem("apply_b_dec_to_input", f"FVU {fvu:.3g} > 1, but {flipped:.3g} with "
                       f"apply_b_dec_to_input={not sae.cfg.apply_b_dec_to_input}: the input-bias "
                       "convention of the format was read wrongly")
    scored = [(_fvu(sae, sample, s), s) for s in _SCALES]
    best, scale = min(scored)
    if _good(best, fvu):
        return Problem("normalisation", f"FVU {fvu:.3g} > 1, but {best:.3g} once inputs are scaled by "
                       f"{scale:g}: the SAE expects normalised activations (normalize_activations / "
                       "norm_scaling_factor missing or wrong)")
    for other, other_rows in other_hooks.items():
        other_fvu = _fvu(sae, other_rows[:DIAGNOSIS_TOKENS])
        if _good(other_fvu, fvu):
            return Problem("hook", f"FVU {fvu:.3g} on {hook} but {other_fvu:.3g} on {other}: the SAE was "
                           f"trained on another hook (import it with --hook {other})")
    return Problem("fvu", f"FVU {fvu:.3g} > 1: the SAE reconstructs {hook} worse than its mean; it was "
                   "trained on another model, hook or normalisation")


def check_sae(
    sae: SAE,
    rows: torch.Tensor,
    metrics: dict[str, float],
    *,
    hook: str,
    expected_l0: float | None = None,
    other_hooks: dict[str, torch.Tensor] | None = None,
) -> list[Problem]:
    """Problems of `sae` on activation `rows [n, d_in]` of `hook`, given its `metrics` there
    (`fvu`, `l0`, `dead_fraction`); empty when it looks correctly loaded. `other_hooks`
    holds rows of the atlas's other hooks of the same width, to recognise a wrong hook."""
    problems: list[Problem] = []
    cfg = sae.cfg
    fvu, l0 = float(metrics["fvu"]), float(metrics["l0"])
    if sae.has_threshold:
        limit = max(DENSE_SHARE * cfg.d_sae, L0_FACTOR * cfg.k if cfg.k else 0.0)
        if l0 > limit:
            stripped = " (every threshold is 0)" if float(sae.threshold.detach().max()) <= 0 else ""
            problems.append(Problem("threshold", f"L0 {l0:.1f} of d_sae {cfg.d_sae}{stripped}: a "
                                    f"{cfg.architecture} SAE this dense has lost its threshold "
                                    "(SAELens issue #608); re-export it with the threshold"))
    reference = expected_l0 or (cfg.k if sae.k_is_mean_l0 else None)
    if reference and not problems and not reference / L0_FACTOR <= l0 <= reference * L0_FACTOR:
        problems.append(Problem("l0", f"L0 {l0:.1f} is far from the {reference:g} its release / config "
                                "implies: wrong threshold, k or normalisation"))
    swapped = _transposed(sae)
    swapped_fvu = _fvu(swapped, rows[:DIAGNOSIS_TOKENS]) if swapped is not None else math.inf
    if _good(swapped_fvu, fvu if math.isfinite(fvu) else math.inf):
        problems.append(Problem("transposed", f"FVU {fvu:.3g}, but {swapped_fvu:.3g} with W_enc and W_dec "
                                "swapped and transposed: the file stores them the other way round"))
    elif not math.isfinite(fvu) or fvu > MAX_FVU:
        problems.append(_diagnose_fvu(sae, rows, fvu if math.isfinite(fvu) else math.inf, other_hooks or {}, hook))
    if float(metrics.get("dead_fraction", 0.0)) >= 1.0:
        problems.append(Problem("dead", f"no latent fires on {rows.shape[0]} tokens of {hook}"))
    return problems
