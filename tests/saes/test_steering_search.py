"""Steering toward a target (`saes.intervene.steering_search`, `saes.intervene.strength`):
a planted promoter outranks a planted detector the steering table wrongly credits; the
ready edit reproduces the measured ratio in a full spliced forward; the calibrated strength
is the smallest that reaches the ratio under the KL bound, and the sweep refuses when none
does; clamp rows equal a spliced clamp; bad targets and strengths are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.edits import ClampEdit, SteerEdit, compile_edit, resolve_positions
from sae_atlas.saes.intervene.splice import Splice, run_spliced
from sae_atlas.saes.intervene.steering_effects import (
    direction_deltas,
    hook_steering,
    target_effects,
)
from sae_atlas.saes.intervene.steering_prompts import heldout_prompts
from sae_atlas.saes.intervene.steering_search import (
    SearchParams,
    contrast_tokens,
    rank_features,
    resolve_target,
)
from sae_atlas.saes.intervene.strength import (
    StrengthScale,
    calibrate,
    geometric_grid,
    require_reached,
)
from tests.saes.planted import one_thread  # noqa: F401
from tests.saes.steering_planted import DETECTOR, HOOK, PROMOTER, TOKEN, Planted, planted_steering

PARAMS = SearchParams(k=4, candidates=4, n_prompts=6, prompt_tokens=8, fluency_prompts=2, fluency_tokens=4,
                      ratio=1.5, kl_bound=0.5, highest=8.0, styles=("neutral",), confirm_prompts=6)


@pytest.fixture(scope="module")
def planted() -> Planted:
    return planted_steering()


def test_a_planted_promoter_ranks_above_the_detector_and_its_edit_reproduces_the_measurement(planted: Planted) -> None:
    result = rank_features(planted.handle, [planted.source], TOKEN, PARAMS)
    latents = [f.latent for f in result.features]
    assert latents[0] == PROMOTER and DETECTOR in latents, latents
    top, detector = result.features[0], result.features[latents.index(DETECTOR)]
    assert "lens" in top.sources and "table" in detector.sources  # the table's claim made it a candidate
    assert top.reached and top.ratio >= PARAMS.ratio and top.kl_rest <= PARAMS.kl_bound
    assert not detector.reached and detector.best_ratio < 1.1 < top.best_ratio
    assert top.edit == {"kind": "steer", "sae": "planted", "feature": PROMOTER, "alpha": top.strength["alpha"],
                        "at": "last"}
    assert top.strength["norm_fraction"] * result.resid_norms["planted"] == pytest.approx(top.strength["alpha"], rel=1e-5)
    assert top.strength["act_multiple"] == pytest.approx(top.strength["alpha"])  # mean active value 1
    assert top.perplexity is not None and result.baseline_perplexity is not None
    # the ready edit, run as a full spliced forward on the same held-out prompts, measures the same ratio
    prompts = heldout_prompts(planted.handle, PARAMS.n_prompts, PARAMS.prompt_tokens, result.seed,
                              [planted.source.table_prompts])
    mask = resolve_positions("last", [], prompts.shape[1], prompts.shape[1])
    edit = compile_edit(SteerEdit(**top.edit), mask, sae=planted.source.sae, hook=HOOK)
    edited = run_spliced(planted.handle, prompts, Splice({}, [edit])).logits_TV[:, -1]
    clean = run_spliced(planted.handle, prompts, Splice()).logits_TV[:, -1]
    assert target_effects(edited[None], clean, [planted.token_id]).ratio[0] == pytest.approx(top.ratio, rel=1e-3)
    # one grid step weaker reaches the ratio on fewer than pair_share of the prompts: the calibrated strength is the
    # smallest that does
    weaker = top.strength["norm_fraction"] / 2 ** (1 / PARAMS.per_doubling)
    siblings = [planted.handle.tokenizer.convert_tokens_to_ids(t.strip()) for t in result.siblings]
    assert result.category == "animals" and "dog" in [t.strip() for t in result.siblings]
    with hook_steering(planted.handle, prompts, HOOK, [planted.token_id], sibling_ids=siblings) as probe:
        unit = planted.source.sae.W_dec.detach()[PROMOTER:PROMOTER + 1]
        pe = probe.prompt_effects(direction_deltas(unit, np.array([weaker]), probe.resid_norm))
        assert ((pe.gain() >= np.log(PARAMS.ratio)) & (pe.kl_rest <= PARAMS.kl_bound)).mean() < PARAMS.pair_share


def test_the_sweep_refuses_when_no_strength_reaches_the_ratio_under_the_bound(planted: Planted) -> None:
    params = SearchParams(**{**PARAMS.__dict__, "kl_bound": 1e-7, "k": 1, "fluency_prompts": 0})
    top = rank_features(planted.handle, [planted.source], TOKEN, params).features[0]
    assert not top.reached
    with pytest.raises(InvalidInputError, match="no strength"):
        require_reached(calibrate(np.array([top.strength["norm_fraction"]]), np.array([top.ratio]),
                                  np.array([top.kl_rest]), ratio=params.ratio, kl_bound=params.kl_bound),
                        "the feature", ratio=params.ratio, kl_bound=params.kl_bound)


def test_calibrate_picks_the_smallest_strength_reaching_the_ratio_under_the_bound() -> None:
    grid = geometric_grid(0.125, 2.0)
    ratio = np.array([1.0, 1.5, 2.0, 3.5, 5.0, 8.0, 12.0, 20.0, 30.0])
    kl = np.array([0.0, 0.01, 0.05, 2.0, 0.3, 0.4, 0.9, 3.0, 5.0])  # 3.5x breaks the bound
    cal = calibrate(grid, ratio, kl, ratio=3.0, kl_bound=1.0)
    assert len(grid) == 9 and cal.reached and cal.norm_fraction == pytest.approx(grid[4]) and cal.ratio == 5.0
    assert cal.best_ratio == 12.0
    missed = calibrate(grid, ratio, kl, ratio=15.0, kl_bound=1.0)
    assert not missed.reached and missed.ratio == 12.0 and missed.norm_fraction == pytest.approx(grid[6])
    with pytest.raises(InvalidInputError, match="best under the bound: 12x"):
        require_reached(missed, "it", ratio=15.0, kl_bound=1.0)


def test_clamp_rows_equal_a_spliced_clamp_at_the_last_token(planted: Planted) -> None:
    handle, sae = planted.handle, planted.source.sae
    prompts = heldout_prompts(handle, 3, 8, 5, [])
    values = np.array([[0.0, 2.0], [1.0, 3.0]])
    with hook_steering(handle, prompts, HOOK, [planted.token_id]) as probe:
        fast = probe.clamps(sae, [PROMOTER, DETECTOR], values)
        clean = probe.clean_PV
    mask = resolve_positions("last", [], prompts.shape[1], prompts.shape[1])
    for row, (latent, value) in enumerate([(PROMOTER, 0.0), (PROMOTER, 2.0), (DETECTOR, 1.0), (DETECTOR, 3.0)]):
        edit = compile_edit(ClampEdit(sae="planted", feature=latent, value=value, at="last"), mask, sae=sae, hook=HOOK)
        full = run_spliced(handle, prompts, Splice({"planted": (HOOK, sae)}, [edit])).logits_TV[:, -1]
        slow = target_effects(full[None], clean, [planted.token_id])
        assert fast.ratio[row] == pytest.approx(slow.ratio[0], rel=1e-4)
        assert fast.kl[row] == pytest.approx(slow.kl[0], abs=1e-5)


def test_target_effects_of_a_planted_logit_shift() -> None:
    clean = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    ids = [3, 7]
    steered = clean.clone()
    steered[:, ids] += 2.0  # only the target moves: the rest keeps its shape
    eff = target_effects(steered[None], clean, ids)
    q = torch.softmax(clean, -1)[:, ids].sum(-1)
    p = torch.softmax(steered, -1)[:, ids].sum(-1)
    assert eff.ratio[0] == pytest.approx(float(p.mean() / q.mean()), rel=1e-5)
    assert eff.kl_rest[0] == pytest.approx(0.0, abs=1e-6) and eff.kl[0] > 0.01
    other = clean.clone()
    other[:, 11] += 3.0
    assert target_effects(other[None], clean, ids).kl_rest[0] > 0.01


def test_targets_resolve_to_token_sets_and_bad_ones_are_named(planted: Planted) -> None:
    tok, V = planted.handle.tokenizer, planted.handle.d_vocab
    assert resolve_target(tok, " cat", V).token_ids == [planted.token_id]
    assert resolve_target(tok, ["cat", planted.token_id, "dog"], V).token_ids == [planted.token_id,
                                                                                 tok.convert_tokens_to_ids("dog")]
    assert len(resolve_target(tok, {"kind": "concept", "concept": "weekdays"}, V).token_ids) == 7
    assert contrast_tokens(tok, ["the cat sat", "a cat and a cat"], ["the dog sat", "a dog"])[0] == planted.token_id
    for bad, message in [("zebra", "not in the model's vocabulary"), ("cat dog", "encodes as 2 tokens"),
                         (10**6, "outside the vocabulary"), ({"kind": "shape"}, "invalid steering target"),
                         ({"kind": "contrast", "texts_a": [], "texts_b": ["the dog"]}, "texts_a is empty"),
                         ({"kind": "contrast", "texts_a": ["the cat"], "texts_b": [" "]}, "texts_b is empty"),
                         ({"kind": "contrast", "texts_a": ["the cat"], "texts_b": ["the dog"]}, "at least twice")]:
        with pytest.raises(InvalidInputError, match=message):
            resolve_target(tok, bad, V)


def test_strengths_and_parameters_outside_their_bounds_are_refused(planted: Planted) -> None:
    scale = StrengthScale(row_norm=2.0, resid_norm=10.0, mean_active_act=4.0)
    assert scale.alpha(0.5, "norm_fraction") == 2.5 and scale.alpha(3, "act_multiple") == 12.0
    assert scale.units(2.5) == {"alpha": 2.5, "act_multiple": 0.625, "norm_fraction": 0.5}
    for value, unit, message in [(100.0, "norm_fraction", "norm_fraction must be"), (-1.0, "act_multiple", "act_multiple"),
                                 (float("nan"), "alpha", "alpha"), (1e6, "alpha", "alpha"), (1.0, "volts", "unknown")]:
        with pytest.raises(InvalidInputError, match=message):
            scale.alpha(value, unit)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="mean active value"):
        StrengthScale(1.0, 1.0, None).alpha(2.0, "act_multiple")
    for change, message in [({"ratio": 0.5}, "ratio"), ({"kl_bound": 0.0}, "kl_bound"), ({"mode": "push"}, "mode"),
                            ({"highest": 50.0}, "highest strength"), ({"k": 0}, "k must")]:
        with pytest.raises(InvalidInputError, match=message):
            SearchParams(**{**PARAMS.__dict__, **change}).check()
    with pytest.raises(InvalidInputError, match="seed 0 drew the steering table"):
        rank_features(planted.handle, [planted.source], TOKEN, SearchParams(**{**PARAMS.__dict__, "seed": 0}))
