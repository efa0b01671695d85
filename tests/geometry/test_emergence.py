"""The emergence table on planted codes: a concept planted from member 2 on is first reached
there and stays; one that disappears at member 1 and re-appears at member 2 shows the gap
and the re-appearance; members without it score at chance."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.emergence import SCORE_SCHEMA, emergence_tables, member_scores, onsets
from sae_atlas.geometry.figures_emergence import emergence_figure

MEMBERS = ["m0", "m1", "m2", "m3", "m4"]
N, F = 60, 30


VALUES = np.arange(N) % 6


def _codes(planted: bool, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse non-negative codes of N concept and N control prompts and the concept prompts'
    values (6); when planted, latent 7 fires on every concept prompt and on no control, and
    latent 11 on concept prompts with a strength set by the value."""
    rng = np.random.default_rng(seed)
    pos, neg = (np.abs(rng.normal(size=(N, F))) * (rng.random((N, F)) < 0.3) for _ in range(2))
    if planted:
        pos[:, 7] = 1.0 + rng.random(N)
        neg[:, 7] = 0.0
        pos[:, 11], neg[:, 11] = 1.0 + VALUES, 0.0
    return pos, neg, VALUES


def _scores(pattern: dict[str, list[bool]]) -> pl.DataFrame:
    rows = [{"concept": c, "member": m, **member_scores(*_codes(on, 10 * i + j))}
            for i, (c, flags) in enumerate(pattern.items()) for j, (m, on) in enumerate(zip(MEMBERS, flags, strict=True))]
    return pl.DataFrame(rows, schema={"concept": pl.String, "member": pl.String, **SCORE_SCHEMA})


def test_planted_onsets_gaps_and_reappearances_are_found():
    pattern = {"late": [False, False, True, True, True], "flicker": [True, False, True, True, True]}
    scored, onset = emergence_tables(_scores(pattern), MEMBERS, threshold=0.9)
    for r in scored.iter_rows(named=True):
        planted = pattern[r["concept"]][MEMBERS.index(r["member"])]
        assert r["reached"] == planted
        if planted:
            assert r["latent"] in (7, 11) and r["auroc"] == 1.0 and r["k1_accuracy"] > 0.95 and r["probe_accuracy"] > 0.9
            assert r["value_latent"] == 11 and r["value_selectivity"] == pytest.approx(1.0)
        else:
            assert 0.2 < r["auroc"] < 0.85 and r["k1_accuracy"] < 0.8
            assert r["value_selectivity"] is None or r["value_selectivity"] < 0.5
    rows = {r["concept"]: r for r in onset.iter_rows(named=True)}
    assert rows["late"]["first"] == "m2" and rows["late"]["first_index"] == 2 and rows["late"]["gaps"] == []
    assert rows["late"]["stable_from"] == "m2" and rows["late"]["reappears"] == []
    assert rows["flicker"]["first"] == "m0" and rows["flicker"]["gaps"] == ["m1"]
    assert rows["flicker"]["reappears"] == ["m2"] and rows["flicker"]["stable_from"] == "m2"
    by_probe = emergence_tables(_scores(pattern), MEMBERS, metric="k1_accuracy", threshold=0.9)[1]
    assert by_probe.filter(pl.col("concept") == "late")["first"].item() == "m2"
    fig = emergence_figure(scored, MEMBERS, "auroc", 0.9)
    assert len(fig.axes[0].patches) == 7  # one frame per (concept, member) that has it


def test_onsets_of_a_concept_never_reached_or_lost_at_the_end():
    assert onsets([False, False], ["a", "b"])["first"] is None
    lost = onsets([True, True, False], ["a", "b", "c"])
    assert lost["first"] == "a" and lost["gaps"] == ["c"] and lost["stable_from"] is None


def test_bad_input_is_refused():
    assert member_scores(*_codes(True, 0)[:2])["value_selectivity"] is None  # no values given
    with pytest.raises(InvalidInputError, match="one width"):
        member_scores(np.zeros((10, 3)), np.zeros((10, 4)))
    with pytest.raises(InvalidInputError, match="metric"):
        emergence_tables(_scores({"late": [True] * 5}), MEMBERS, metric="f1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="every member"):
        emergence_tables(_scores({"late": [True] * 5}), MEMBERS + ["m5"])
