"""A sparse combination of SAE features fitted to steer toward a target, in the spirit of
SAE-targeted steering (Chalnev et al. 2024): the edit is `delta = s * sum_f w_f u_f` with
`u_f` the unit decoder rows of a pool of candidate latents, added at the last token.

The weights (norm fractions of the hook's residual norm) minimise, on the ranking prompts,

    - mean_i min(g_i, c) + kl_weight * mean_i kl_rest_i + l1 * sum_f |w_f|

with `g_i` the prompt's specific gain (`steering_effects`: the target's log-probability
gain less any gain of its siblings), capped at `c = 2 log(ratio)` so nothing pushes past
the requested effect, and `kl_rest_i` the KL on the rest of the next-token distribution
(the text the edit was not asked to move). Adam from a small uniform start; then the
`n_features` largest weights are kept and refitted without the L1 term. The prompts'
prefixes run once into KV caches; each step runs only their last tokens, with gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.hook_fns import in_residual
from sae_atlas.saes.intervene.decode import cache_arguments
from sae_atlas.saes.intervene.steering_prompts import PromptSet
from sae_atlas.saes.models import ModelHandle


@dataclass(frozen=True)
class FitParams:
    """How a combination is fitted."""

    n_features: int = 3
    steps: int = 40
    refit_steps: int = 20
    lr: float = 0.08
    l1: float = 0.01
    kl_weight: float = 1.0
    init: float = 0.05


@dataclass
class Fitted:
    """Fitted weights: latents of the pool and their weights in norm fractions."""

    latents: list[int]
    weights: list[float]
    loss: float


class _CachedPrompts:
    """The prompts' prefixes run once (no gradients) into one KV cache per prompt length;
    `logits(delta_D)` then runs only the last tokens, `delta_D` added at `hook` there, with
    gradients to `delta_D`: next-token logits `[P, V]` in the prompts' order."""

    def __init__(self, handle: ModelHandle, prompts: PromptSet, hook: str) -> None:
        from transformers import DynamicCache

        self.handle, self.hook = handle, handle.check_hook(hook)
        model = handle.bridge.original_model
        lengths = np.array([len(t) for t in prompts.tokens])
        self.groups = []
        for n in np.unique(lengths):
            idx = np.flatnonzero(lengths == n)
            rows = torch.stack([prompts.tokens[i] for i in idx]).to(handle.device)
            cache = DynamicCache(config=model.config)
            with torch.no_grad():
                handle.bridge.forward(rows[:, :-1], **cache_arguments(model, cache))
            self.groups.append((idx, rows[:, -1:], cache))
        self.order = torch.as_tensor(np.argsort(np.concatenate([idx for idx, _, _ in self.groups]), kind="stable"))

    def logits(self, delta_D: torch.Tensor | None) -> torch.Tensor:
        def add(act: torch.Tensor, hook: object = None) -> torch.Tensor:
            return act + delta_D.to(act)

        model = self.handle.bridge.original_model
        hooks = [] if delta_D is None else [(self.hook, add)]
        parts = []
        with self.handle.bridge.hooks(fwd_hooks=in_residual(self.handle.bridge, hooks)):
            for _, last_B1, cache in self.groups:
                out = self.handle.bridge.forward(last_B1, **cache_arguments(model, copy.deepcopy(cache)))
                parts.append(out[:, -1].float())
        return torch.cat(parts)[self.order.to(parts[0].device)]


def fit_combination(handle: ModelHandle, prompts: PromptSet, hook: str, unit_ND: torch.Tensor, latents: Sequence[int],
                    resid_norm: float, token_ids: Sequence[int], sibling_ids: Sequence[int], ratio: float,
                    params: FitParams = FitParams()) -> Fitted:
    """Fit the combination of the module docstring over the pool `latents` (unit decoder
    rows `unit_ND`) on `prompts`."""
    if len(latents) < params.n_features or params.n_features < 1:
        raise InvalidInputError(f"a combination of {params.n_features} features needs at least that many candidates, "
                                f"got {len(latents)}")
    cached = _CachedPrompts(handle, prompts, hook)
    ids = torch.as_tensor(list(token_ids))
    sib = torch.as_tensor(list(sibling_ids), dtype=torch.long)
    with torch.no_grad():
        logq = torch.log_softmax(cached.logits(None), -1)
    lq_T = logq[:, ids].logsumexp(-1)
    lq_S = logq[:, sib].logsumexp(-1) if len(sib) else None
    rq = torch.log_softmax(logq.index_fill(-1, ids, float("-inf")), -1)
    cap = 2 * float(np.log(ratio))
    U = unit_ND.float().cpu()

    def loss_of(w: torch.Tensor, keep: torch.Tensor, l1: float) -> torch.Tensor:
        logp = torch.log_softmax(cached.logits((w * keep) @ U * resid_norm), -1)
        gain = logp[:, ids].logsumexp(-1) - lq_T
        if lq_S is not None:
            gain = gain - (logp[:, sib].logsumexp(-1) - lq_S).clamp_min(0)
        rp = torch.log_softmax(logp.index_fill(-1, ids, float("-inf")), -1)
        kl_rest = torch.nan_to_num(rq.exp() * (rq - rp), nan=0.0).sum(-1)
        return -gain.clamp_max(cap).mean() + params.kl_weight * kl_rest.mean() + l1 * (w * keep).abs().sum()

    def run(w: torch.Tensor, keep: torch.Tensor, steps: int, l1: float) -> float:
        opt = torch.optim.Adam([w], lr=params.lr)
        value = float("nan")
        for _ in range(steps):
            with torch.enable_grad():
                loss = loss_of(w, keep, l1)
                (grad,) = torch.autograd.grad(loss, [w])
            opt.zero_grad()
            w.grad = grad
            opt.step()
            value = float(loss.detach())
        return value

    w = torch.full((len(latents),), params.init, requires_grad=True)
    everyone = torch.ones(len(latents))
    run(w, everyone, params.steps, params.l1)
    top = w.detach().abs().topk(params.n_features).indices
    keep = torch.zeros(len(latents))
    keep[top] = 1.0
    loss = run(w, keep, params.refit_steps, 0.0)
    order = top[w.detach()[top].abs().argsort(descending=True)]
    return Fitted([int(latents[i]) for i in order], [float(w.detach()[i]) for i in order], loss)
