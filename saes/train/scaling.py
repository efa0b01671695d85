"""Input normalisation: one scalar so that `E||x||^2 = d_in`, folded into the weights.

Training sees `s * x`. With `W_enc`, `W_dec` kept, dividing `b_enc`, `b_dec` and the
thresholds by `s` gives an SAE on raw activations whose pre-activations and code are
those of the trained SAE divided by `s` (every code here is positively homogeneous:
ReLU, top-k, batch top-k and JumpReLU with a scaled threshold), so its reconstruction is
`x_hat(s x) / s` and the decoder rows stay unit norm.
"""

from __future__ import annotations

import copy
import math

import torch

from saes.sae.base import SAE


def input_scale(sum_sq_norms: float, n_tokens: int, d_in: int) -> float:
    """The scalar `s = sqrt(d_in / E||x||^2)` from the summed squared norms of n tokens."""
    mean_sq = sum_sq_norms / max(1, n_tokens)
    if not mean_sq > 0:
        return 1.0
    return math.sqrt(d_in / mean_sq)


@torch.no_grad()
def fold_input_scale(sae: SAE, scale: float) -> SAE:
    """A copy of `sae` (trained on `scale * x`) that works on raw `x` (see module doc)."""
    folded = copy.deepcopy(sae)
    folded.b_enc.div_(scale)
    folded.b_dec.div_(scale)
    folded.divide_thresholds(scale)
    return folded
