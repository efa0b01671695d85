"""Acceptance battery: every kind of atlas file flipped, truncated and deleted, every read
path run on it; each answer is the undamaged one, or an error (or report) naming the
damaged file and its repair, never a silently different answer. The outcomes are the
table in RELIABILITY.md (`python -m tests.store.corruption` rewrites it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.store import corruption as battery

OUTCOMES: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
CASES = [(kind, how) for kind in battery.FILES for how in battery.DAMAGES]
PARAMS = [pytest.param(kind, how, id=f"{kind}-{how}".replace(" ", "_")) for kind, how in CASES]
RELIABILITY = Path(__file__).resolve().parents[2] / "RELIABILITY.md"


@pytest.fixture(scope="module")
def baselines(battery_atlas: Path) -> dict[str, Any]:
    return battery.baselines(battery_atlas)


@pytest.mark.parametrize(("kind", "how"), PARAMS)
def test_damage_is_refused_or_harmless(kind: str, how: str, battery_atlas: Path, baselines: dict[str, Any],
                                       tmp_path: Path) -> None:
    results = battery.run_case(battery_atlas, tmp_path / "atlas", kind, how, baselines)
    OUTCOMES[kind, how] = results
    bad = {name: f"{outcome}: {detail[:300]}" for name, (outcome, detail) in results.items()
           if outcome not in battery.ACCEPTABLE}
    assert not bad, f"{kind} {how}: {bad}"


def test_damage_is_seen_by_some_read_path() -> None:
    """A battery whose probes never notice anything would pass vacuously: every damaged file
    that a read path reads must change some outcome."""
    if len(OUTCOMES) < len(CASES):
        pytest.skip("needs the whole battery in this run")
    unread = {"sparsity.safetensors", "eval.json"}  # no read path of the atlas reads them
    for kind in battery.FILES:
        if kind not in unread:
            assert any(battery.cell(OUTCOMES[kind, how]) != "unaffected" for how in battery.DAMAGES), kind


def test_reliability_table_is_current() -> None:
    if len(OUTCOMES) < len(CASES):
        pytest.skip("needs the whole battery in this run")
    assert battery.generated_table(RELIABILITY) == battery.table(OUTCOMES), (
        "RELIABILITY.md is out of date: regenerate it with `python -m tests.store.corruption`")
