"""A sparse combination of features fitted toward a target (`saes.intervene.steering_combination`)
recovers a planted steering direction made of three features, and the search reports it
in the SAE basis with ready edits, confirmed on held-out prompts."""

from __future__ import annotations

import numpy as np
import torch

from sae_atlas.saes.intervene.steering_combination import _CachedPrompts, fit_combination
from sae_atlas.saes.intervene.steering_effects import prompt_steering
from sae_atlas.saes.intervene.steering_prompts import PromptSet, heldout_prompts
from sae_atlas.saes.intervene.steering_search import SearchParams, rank_features
from tests.saes.planted import one_thread  # noqa: F401
from tests.saes.steering_planted import HOOK, PARTS, TABLE_PROMPTS, planted_combination


def test_a_fitted_combination_recovers_a_planted_direction_of_three_features() -> None:
    planted = planted_combination()
    handle, sae = planted.handle, planted.source.sae
    rows = heldout_prompts(handle, 8, 8, 1, [TABLE_PROMPTS])
    prompts = PromptSet(list(rows), ["neutral"] * len(rows))
    unit = sae.W_dec.detach().float()
    pool = list(range(len(unit)))
    norm = prompt_steering(handle, prompts, HOOK, [planted.token_id]).resid_norm
    fitted = fit_combination(handle, prompts, HOOK, unit, pool, norm, [planted.token_id], [], ratio=1.5)
    assert set(fitted.latents) == set(PARTS), fitted
    w = np.array(fitted.weights)
    assert (w > 0).all() and w.max() / w.min() < 1.5  # about equal, as planted
    direction = torch.tensor(fitted.weights) @ unit[fitted.latents]
    target = handle.W_U.detach().float()[:, planted.token_id]
    assert float(torch.cosine_similarity(direction, target, dim=0)) > 0.95
    params = SearchParams(k=2, candidates=12, n_prompts=6, prompt_tokens=8, confirm_prompts=6, fluency_prompts=0,
                          ratio=1.3, kl_bound=1.0, highest=8.0, styles=("neutral",), combine=3, combine_pool=12)
    result = rank_features(handle, [planted.source], "cat", params)
    combo = result.combination
    assert combo is not None and set(combo.latents) == set(PARTS)
    assert [e["feature"] for e in combo.edits] == combo.latents and all(e["kind"] == "steer" for e in combo.edits)
    assert combo.confirmed.n_prompts == 6 and combo.confirmed.ratio > 1.0
    single = result.features[0]
    assert combo.confirmed.score > single.confirmed.score and result.best == "combination"


def test_the_fit_runs_last_tokens_on_cached_prefixes_as_a_full_forward_would() -> None:
    planted = planted_combination()
    handle = planted.handle
    texts = ["the cat sat on the mat", "a dog ran", "the cow sat on the", "a cat"]
    prompts = PromptSet([handle.to_tokens(t)[0] for t in texts], ["user"] * len(texts))
    delta = torch.randn(handle.d_model, generator=torch.Generator().manual_seed(0), requires_grad=True)
    with torch.enable_grad():
        cached = _CachedPrompts(handle, prompts, HOOK).logits(delta)
        (grad,) = torch.autograd.grad(cached[:, planted.token_id].sum(), [delta])
    assert grad.abs().sum() > 0  # the gradient reaches the steering vector
    def add_last(act: torch.Tensor, hook: object = None) -> torch.Tensor:
        act = act.clone()
        act[:, -1] += delta.detach()
        return act

    for i, tokens in enumerate(prompts.tokens):
        full = handle.bridge.run_with_hooks(tokens[None], fwd_hooks=[(HOOK, add_last)])[0, -1]
        assert torch.allclose(cached[i].detach(), full.float(), atol=1e-4)
