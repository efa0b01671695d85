"""The steering benchmark (`saes.intervene.steer_bench`) on a planted tiny model: every arm
is measured on held-out prompts of each style, the best-ranked feature is the planted
promoter and beats a random feature of the same norm, the naive top-activating choice is
the planted detector, the shares of pairs reached pool per arm and style with intervals,
and the plot is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.steer_bench import (
    ARMS,
    BenchParams,
    plot_bench,
    share_table,
    steer_bench,
)
from sae_atlas.saes.intervene.steering_search import SearchParams
from tests.saes.planted import one_thread  # noqa: F401
from tests.saes.steering_planted import DETECTOR, PROMOTER, TOKEN, planted_steering

PARAMS = BenchParams(search=SearchParams(k=1, candidates=4, n_prompts=6, prompt_tokens=8, fluency_prompts=0,
                                         ratio=1.5, kl_bound=0.5, highest=8.0))


def test_every_arm_is_measured_and_the_planted_promoter_beats_random(tmp_path: Path) -> None:
    planted = planted_steering()
    rows = steer_bench(planted.handle, [planted.source], [TOKEN], PARAMS)
    arms = {r.arm: r for r in rows}
    assert list(arms) == list(ARMS) and all(r.target == "'cat'" for r in rows)
    assert arms["feature_add"].latent == arms["feature_clamp"].latent == PROMOTER
    assert arms["top_activating"].latent == DETECTOR  # the naive choice: most active on the token
    assert arms["random_feature"].latent not in (PROMOTER, DETECTOR)
    assert arms["feature_add"].reached and not arms["random_feature"].reached
    assert arms["feature_add"].matched_ratio > 1.2 * arms["random_feature"].matched_ratio
    assert arms["feature_add"].matched_ratio > 1.2 * arms["top_activating"].matched_ratio
    assert arms["prompting"].norm_fraction is None and arms["prompting"].curve == []
    chosen = arms["top_result"]  # what steering_features returns as its best: the feature or the combination
    assert (chosen.latent, chosen.latents, chosen.pairs) in [(arms[a].latent, arms[a].latents, arms[a].pairs)
                                                            for a in ("feature_add", "combination")]
    grid = [c[0] for c in arms["diff_means"].curve]
    assert grid == sorted(grid) and all(len(r.curve) == len(grid) for r in rows if r.arm != "prompting")
    # every arm is calibrated on the ranking prompts and counted on the held-out ones, per style
    assert set(arms["feature_add"].styles) == {"neutral", "in_context", "question"}
    assert len(arms["combination"].latents) == 3 and PROMOTER in arms["combination"].latents
    shares = {(t["arm"], t["style"]): t for t in share_table([r.__dict__ for r in rows])}
    assert shares["feature_add", "all"]["pairs"] == len(arms["feature_add"].pairs) == 22
    assert shares["feature_add", "all"]["share"] > 0.75 > shares["random_feature", "all"]["share"]
    assert all(0 <= t["share_low"] <= t["share"] <= t["share_high"] <= 1 for t in shares.values())
    assert shares["prompting", "in_context"]["pairs"] == 4
    path = tmp_path / "bench.png"
    plot_bench([r.__dict__ for r in rows], path, PARAMS.search.kl_bound)
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InvalidInputError, match="name the target"):
        steer_bench(planted.handle, [planted.source], [TOKEN], BenchParams(PARAMS.search, prompt_prefix="Cats."))
    with pytest.raises(InvalidInputError, match="not in the model's vocabulary"):
        steer_bench(planted.handle, [planted.source], [TOKEN, "zebra"], PARAMS)
