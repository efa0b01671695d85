"""Acceptance battery: every kind of atlas file flipped, truncated and deleted, and groups of
one SAE's files replaced by another SAE's intact ones, every read path run on it; each
answer is the undamaged one, or an error (or report) naming the damaged (or stale) file
and its repair, never a silently different answer. The same damage to every eval result
kind, to an imported circuit-tracer CLT and to the inputs of `register`. The outcomes are
the tables in RELIABILITY.md (`python -m tests.store.corruption` rewrites them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.store import corruption as battery

OUTCOMES: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
FOREIGN_OUTCOMES: dict[str, dict[str, tuple[str, str]]] = {}
GROUP_OUTCOMES: dict[str, dict[tuple[str, str], dict[str, tuple[str, str]]]] = {name: {} for name in battery.GROUPS}
CASES = [(kind, how) for kind in battery.FILES for how in battery.DAMAGES]
PARAMS = [pytest.param(kind, how, id=f"{kind}-{how}".replace(" ", "_")) for kind, how in CASES]
FOREIGN_PARAMS = [pytest.param(case, id=f"foreign-{case}".replace(" ", "_")) for case in battery.FOREIGN]
GROUP_PARAMS = {name: [pytest.param(kind, how, id=f"{kind}-{how}".replace(" ", "_")) for kind in files
                       for how in battery.DAMAGES] for name, (_, files) in battery.GROUPS.items()}
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


@pytest.mark.parametrize("case", FOREIGN_PARAMS)
def test_foreign_files_are_refused_by_name(case: str, battery_atlas: Path, baselines: dict[str, Any],
                                           tmp_path: Path) -> None:
    """Files that are each intact but belong to another SAE are never served as this SAE's:
    some read path refuses them naming this SAE's stale file, and none answers silently."""
    results = battery.run_foreign(battery_atlas, tmp_path / "atlas", case, baselines)
    FOREIGN_OUTCOMES[case] = results
    bad = {name: f"{outcome}: {detail[:300]}" for name, (outcome, detail) in results.items()
           if outcome not in battery.ACCEPTABLE}
    assert not bad, f"{case}: {bad}"
    assert any(outcome == "refused" for outcome, _ in results.values()), case


def _acceptable(results: dict[str, tuple[str, str]], case: str) -> None:
    bad = {name: f"{outcome}: {detail[:300]}" for name, (outcome, detail) in results.items()
           if outcome not in battery.ACCEPTABLE}
    assert not bad, f"{case}: {bad}"


@pytest.mark.parametrize(("kind", "how"), GROUP_PARAMS["evals"])
def test_damaged_eval_results_are_refused_by_name(kind: str, how: str, battery_atlas: Path,
                                                  baselines: dict[str, Any], tmp_path: Path) -> None:
    """Every eval result kind and its sidecar: the board marks the SAE damaged, the result's
    readers refuse naming the file; an eval whose file is intact answers as before."""
    results = battery.run_eval_case(battery_atlas, tmp_path / "atlas", kind, how, baselines)
    GROUP_OUTCOMES["evals"][kind, how] = results
    _acceptable(results, f"{kind} {how}")
    assert results["eval_result"][0] == "refused" and results["board"][0] == "reported", results


@pytest.fixture(scope="module")
def clt_atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return battery.build_clt_atlas(tmp_path_factory.mktemp("clt") / "atlas")


@pytest.fixture(scope="module")
def clt_baselines(clt_atlas: Path) -> dict[str, Any]:
    return battery.clt_baselines(clt_atlas)


@pytest.mark.parametrize(("kind", "how"), GROUP_PARAMS["clt"])
def test_a_damaged_imported_clt_is_refused_by_name(kind: str, how: str, clt_atlas: Path,
                                                   clt_baselines: dict[str, Any], tmp_path: Path) -> None:
    results = battery.run_clt_case(clt_atlas, tmp_path / "atlas", kind, how, clt_baselines)
    GROUP_OUTCOMES["clt"][kind, how] = results
    _acceptable(results, f"{kind} {how}")
    if kind in ("cfg.json", "clt_weights.safetensors"):  # what every read of the CLT verifies
        assert results["load_atlas_clt"][0] == "refused" and results["http"][0] == "refused", results


@pytest.mark.parametrize(("kind", "how"), GROUP_PARAMS["register"])
def test_register_refuses_damaged_inputs_by_name(kind: str, how: str, battery_atlas: Path, tmp_path: Path) -> None:
    """`register` of an SAE folder or analysis run with a damaged file refuses naming it, or
    (a file it does not read) records exactly what an undamaged one records."""
    baseline = battery.register_baseline(battery_atlas, tmp_path / "undamaged", kind)
    results = battery.run_register_case(battery_atlas, tmp_path / "atlas", kind, how, baseline)
    GROUP_OUTCOMES["register"][kind, how] = results
    _acceptable(results, f"{kind} {how}")


def _whole_battery() -> None:
    if (len(OUTCOMES) < len(CASES) or len(FOREIGN_OUTCOMES) < len(battery.FOREIGN)
            or any(len(GROUP_OUTCOMES[name]) < len(params) for name, params in GROUP_PARAMS.items())):
        pytest.skip("needs the whole battery in this run")


def test_damage_is_seen_by_some_read_path() -> None:
    """A battery whose probes never notice anything would pass vacuously: every damaged file
    that a read path reads must change some outcome."""
    _whole_battery()
    unread = {"sparsity.safetensors", "eval.json"}  # no read path of the atlas reads them
    for kind in battery.FILES:
        if kind not in unread:
            assert any(battery.cell(OUTCOMES[kind, how]) != "unaffected" for how in battery.DAMAGES), kind


def test_reliability_table_is_current() -> None:
    _whole_battery()
    assert battery.generated_table(RELIABILITY) == battery.table(OUTCOMES, FOREIGN_OUTCOMES, GROUP_OUTCOMES), (
        "RELIABILITY.md is out of date: regenerate it with `python -m tests.store.corruption`")
