"""Input normalisation: one scalar so that `E||x||^2 = d_in`, folded into the weights.

Training sees `s * x`. With `W_enc`, `W_dec` kept, dividing `b_enc`, `b_dec` and the
thresholds by `s` gives an SAE on raw activations whose pre-activations and code are
those of the trained SAE divided by `s` (every code here is positively homogeneous:
ReLU, top-k, batch top-k and JumpReLU with a scaled threshold), so its reconstruction is
`x_hat(s x) / s` and the decoder rows stay unit norm.

A transcoder trained from `s x` to `t y` (its target has its own scale `t`) folds the
same way with the code divided by `t`: `W_enc` times `s / t`, `b_enc`, the thresholds and
`b_dec` divided by `t`, `W_skip` times `s / t`; its output is `y_hat(s x) / t` and the
decoder rows stay unit norm (with `t = s` this is the SAE's fold).
"""

from __future__ import annotations

import copy
import math

import torch

from sae_atlas.saes.sae.base import SAE


def input_scale(sum_sq_norms: float, n_tokens: int, d_in: int) -> float:
    """The scalar `s = sqrt(d_in / E||x||^2)` from the summed squared norms of n tokens."""
    mean_sq = sum_sq_norms / max(1, n_tokens)
    if not mean_sq > 0:
        return 1.0
    return math.sqrt(d_in / mean_sq)


@torch.no_grad()
def fold_input_scale(sae: SAE, scale: float, output_scale: float | None = None) -> SAE:
    """A copy of `sae` (trained on `scale * x`, predicting `output_scale * y`; None: the
    same scale) that works on raw `x` and predicts raw `y` (see module doc)."""
    out = scale if output_scale is None else output_scale
    folded = copy.deepcopy(sae)
    if out != scale:
        folded.W_enc.mul_(scale / out)
    if folded.cfg.skip:
        folded.W_skip.mul_(scale / out)
    folded.b_enc.div_(out)
    folded.b_dec.div_(out)
    folded.divide_thresholds(out)
    return folded
