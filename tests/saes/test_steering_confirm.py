"""Steering rankings that hold on prompts they never saw (`saes.intervene.steering_search`,
`steering_prompts`, `steering_effects`): on planted latents of a tiny model, a dead latent
is left out (or, asked for, called a direction), a latent raising the whole class ranks
below one raising the target, a latent that wins the screen but fails the confirmation
prompts is not chosen; the prompt sets are disjoint and bad ones are named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.steering_prompts import (
    SetSpec,
    category_tokens,
    read_user_prompts,
    split_sets,
    target_class,
)
from sae_atlas.saes.intervene.steering_search import (
    SearchParams,
    _candidates,
    _live,
    rank_features,
    resolve_target,
)
from tests.saes.planted import one_thread  # noqa: F401
from tests.saes.steering_planted import (
    CLASS,
    CONFIRM_TEXTS,
    DEAD,
    GATED,
    RANK_TEXTS,
    SPECIFIC,
    Planted,
    planted_specificity,
)

PARAMS = SearchParams(k=9, candidates=10, n_prompts=6, prompt_tokens=8, confirm_prompts=6, fluency_prompts=0,
                      ratio=1.3, kl_bound=1.0, highest=8.0, styles=("neutral",), combine=0)


@pytest.fixture(scope="module")
def planted() -> Planted:
    return planted_specificity()


def test_a_dead_latent_is_left_out_by_default_and_called_a_direction_when_included(planted: Planted) -> None:
    result = rank_features(planted.handle, [planted.source], "cat", PARAMS)
    latents = [f.latent for f in result.features]
    # added, the gated latent is a plain copy of the dead one's direction: it ranks first, the dead one not at all
    assert DEAD not in latents and result.left_out_dead == 1 and latents[0] == GATED, latents
    assert all(f.kind == "feature" and f.density == pytest.approx(0.01) for f in result.features)
    with_dead = rank_features(planted.handle, [planted.source], "cat",
                              SearchParams(**{**PARAMS.__dict__, "include_dead": True}))
    dead = next(f for f in with_dead.features if f.latent == DEAD)
    assert dead.kind == "direction" and dead.density == 0.0 and with_dead.left_out_dead == 0


def test_the_search_screen_keeps_the_target_promoters_and_drops_useless_latents(planted: Planted) -> None:
    """The cheap screen (the target's z-scored logit-lens effect less its siblings') passes
    the latents writing the target's unembedding; the dead one, the class-wide one and the
    random ones are not measured."""
    target = resolve_target(planted.handle.tokenizer, "cat", planted.handle.d_vocab)
    siblings = target_class(planted.handle.tokenizer, target.token_ids, planted.handle.d_vocab, "tokens").sibling_ids
    live = _live(planted.source, PARAMS)
    assert set(_candidates(planted.handle, planted.source, target, 2, None, live, siblings)) == {GATED, SPECIFIC}
    assert DEAD not in _candidates(planted.handle, planted.source, target, 9, None, live, siblings)


def test_a_latent_raising_the_whole_class_ranks_below_one_raising_the_target(planted: Planted) -> None:
    result = rank_features(planted.handle, [planted.source], "cat", PARAMS)
    by = {f.latent: f for f in result.features}
    assert result.category == "animals" and {"dog", "horse", "cow"} <= {t.strip() for t in result.siblings}
    specific, klass = by[SPECIFIC], by[CLASS]
    # the class latent raises the target more, and its siblings with it
    assert klass.screen_ratio > specific.screen_ratio and klass.best_ratio > specific.best_ratio
    assert klass.sibling_ratio > 1.2 > specific.sibling_ratio
    assert klass.confirmed.share_reached >= specific.confirmed.share_reached
    assert [f.latent for f in result.features].index(SPECIFIC) < [f.latent for f in result.features].index(CLASS)
    assert specific.confirmed.share_specific > klass.confirmed.share_specific


def test_a_latent_winning_the_screen_but_not_the_confirmation_is_not_chosen(planted: Planted) -> None:
    params = SearchParams(**{**PARAMS.__dict__, "styles": ("user",), "confirm_prompts": 0, "mode": "clamp"})
    texts = [t for pair in zip(RANK_TEXTS, CONFIRM_TEXTS, strict=True) for t in pair]  # even rank, odd confirm
    result = rank_features(planted.handle, [planted.source], "cat", params, prompts=texts)
    by = {f.latent: f for f in result.features}
    assert result.prompt_counts == {"rank": {"user": 6}, "confirm": {"user": 6}}
    gated, specific = by[GATED], by[SPECIFIC]
    assert gated.screen_ratio > specific.screen_ratio and gated.reached  # the screen prefers the gated latent
    assert gated.confirmed.ratio < 1.0 < specific.confirmed.ratio  # it lowers the target where it fires
    assert result.features[0].latent == SPECIFIC
    assert set(specific.confirmed_styles) == {"user"}
    low, high = specific.confirmed.ratio_low, specific.confirmed.ratio_high
    assert low <= specific.confirmed.ratio <= high


def test_ranking_and_confirmation_sets_are_disjoint_and_carry_their_styles(planted: Planted) -> None:
    handle = planted.handle
    cls = target_class(handle.tokenizer, [planted.token_id], handle.d_vocab, "tokens")
    spec = SetSpec(5, 5, 8, 1, 2, ((4, 8, 0),), ("neutral", "in_context", "question", "user"))
    rank, confirm = split_sets(handle, spec, cls, ["the cat sat", "a dog ran", "the cow", "a mat and"])
    assert set(rank.styles) == set(confirm.styles) == {"neutral", "in_context", "question", "user"}
    rows = {tuple(t.tolist()) for t in rank.tokens}
    assert not rows & {tuple(t.tolist()) for t in confirm.tokens}
    assert len(confirm.of_style("neutral")) == 5 and len(confirm.of_style("user")) == 2


def test_bad_prompt_sets_and_categories_are_named(planted: Planted, tmp_path: Path) -> None:
    handle, source = planted.handle, planted.source
    for change, message in [({"confirm_prompts": 1}, "confirmation set would hold 1"),
                            ({"confirm_prompts": 0}, "confirmation set would hold 0")]:
        with pytest.raises(InvalidInputError, match=message):
            rank_features(handle, [source], "cat", SearchParams(**{**PARAMS.__dict__, **change}))
    user_only = SearchParams(**{**PARAMS.__dict__, "styles": ("user",), "confirm_prompts": 0})
    with pytest.raises(InvalidInputError, match="3 user prompt"):
        rank_features(handle, [source], "cat", user_only, prompts=["the cat", "a dog", "the cow"])
    with pytest.raises(InvalidInputError, match="confirmation set holds 0"):
        rank_features(handle, [source], "cat", user_only)
    blank = tmp_path / "prompts.txt"
    blank.write_text("\n   \n\n")
    with pytest.raises(InvalidInputError, match="no usable prompts"):
        read_user_prompts(blank)
    with pytest.raises(InvalidInputError, match="no usable prompts"):
        rank_features(handle, [source], "cat", user_only, prompts=[" "] * 4)
    listed = tmp_path / "prompts.json"
    listed.write_text('["a b", " ", "c"]')
    assert read_user_prompts(listed) == ["a b", "c"]
    with pytest.raises(InvalidInputError, match="does not exist"):
        read_user_prompts(tmp_path / "missing.txt")
    odd = {"name": "zoo", "values": ["zebra", "lion"], "templates": ["We saw a"]}
    with pytest.raises(InvalidInputError, match="'zoo' yields no single-token targets"):
        category_tokens(handle.tokenizer, odd, handle.d_vocab)
    with pytest.raises(InvalidInputError, match="yields no single-token targets"):
        rank_features(handle, [source], "cat", PARAMS, category=odd)
    with pytest.raises(InvalidInputError, match="unknown prompt category"):
        category_tokens(handle.tokenizer, "planets", handle.d_vocab)
    assert np.isin(list(category_tokens(handle.tokenizer, "animals", handle.d_vocab)), [planted.token_id]).any()
