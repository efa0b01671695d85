"""The explorer's Board page in headless Chromium, over a copy of the small atlas whose evals
this test runs (core, mdl, meta, the lexical-proxy autointerp) plus an absorption result of
planted per-letter fractions: the sortable table shows each SAE's numbers, the Pareto plots
place one point per SAE by its values, the absorption bars follow the planted letters and
the autointerp explanations come with their scores and the lexical-proxy label."""

from __future__ import annotations

import functools
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from sae_atlas.saes.eval.absorption import ABSORPTION, AbsorptionConfig
from sae_atlas.saes.eval.mdl import MdlConfig
from sae_atlas.saes.eval.meta import MetaConfig
from sae_atlas.saes.eval.results import write_result
from sae_atlas.saes.eval.spec import EvalOutcome
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.saes.models import load_model
from sae_atlas.store.layout import AtlasLayout
from tests.api.conftest import LiveServer
from tests.api.test_browser import ARTIFACTS, _page, browser  # noqa: F401 (the browser fixture)

PLANTED = {"a": 0.9, "b": 0.05, "c": 0.5, "e": 0.2}  # letter -> absorption fraction of every true positive
EV = "core/explained_variance"


def planted_absorption() -> EvalOutcome:
    """Absorption scores of planted letters through the eval's own scoring."""
    from sae_atlas.geometry.absorption import (
        AbsorptionThresholds,
        LetterAbsorption,
        absorption_scores,
    )

    letters = [LetterAbsorption(letter, 0.9, [i], np.arange(10), np.full(10, fraction), np.arange(10) < 10 * fraction)
               for i, (letter, fraction) in enumerate(PLANTED.items())]
    scores = absorption_scores(letters, AbsorptionThresholds(min_letters=2))
    return EvalOutcome({"mean": scores.metrics}, scores.details, {"words": 40})


@pytest.fixture(scope="module")
def evaluated(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(shutil.copytree(small_atlas["root"], tmp_path_factory.mktemp("board") / "atlas"))
    model = functools.cache(lambda: load_model(AtlasLayout(root).read_meta()["model"]))
    configs = {"meta": MetaConfig(train_steps=200), "mdl": MdlConfig(n_tokens=2048)}
    done = run_suite(root, small_atlas["sae_ids"], ["core", "mdl", "meta", "autointerp"], configs, device="cpu",
                     model=model, progress=False)
    assert not done.failures, done.failures
    write_result(root, small_atlas["sae_ids"][0], ABSORPTION, AbsorptionConfig(min_feats_for_eval=2),
                 planted_absorption(), 0.0)
    return root


def _numbers(texts: list[str]) -> list[float]:
    return [float(re.match(r"[-0-9.e+]+", t).group(0)) for t in texts]  # type: ignore[union-attr]


def test_board_page(browser: Any, evaluated: Path, small_atlas: dict[str, Any]) -> None:  # noqa: F811
    sae_ids = small_atlas["sae_ids"]
    with LiveServer(evaluated) as live:
        board = httpx.get(live.url + "/board", timeout=30).json()
        ev = {row["sae_id"]: row["metrics"][EV] for row in board["rows"]}
        assert len(set(ev.values())) == 2, "the two SAEs need different explained variances"
        page = _page(browser, live.url)
        page.goto(live.url + "/#/board")
        page.wait_for_selector("#board-table tr[data-sae]")
        page.wait_for_selector("#absorption-bars")
        page.wait_for_selector(".autointerp-latent .example")

        # the table: one row per SAE with its numbers; sorting by a header reorders the rows
        assert page.locator("#board-table tr[data-sae]").count() == len(sae_ids)
        columns = page.eval_on_selector_all("#board-table th", "ths => ths.map((th) => th.dataset.column)")
        assert columns[0] == "sae_id" and {"core/l0", EV, "autointerp/autointerp_score"} <= set(columns)
        position = columns.index(EV) + 1
        for order in ("desc", "asc"):
            page.click(f"#board-table th[data-column='{EV}']")
            page.wait_for_selector(f"#board-table th.{order}[data-column='{EV}']")
            shown = page.eval_on_selector_all("#board-table tr[data-sae]", "trs => trs.map((tr) => tr.dataset.sae)")
            assert shown == sorted(ev, key=ev.get, reverse=order == "desc")
            cells = page.locator(f"#board-table tr[data-sae] td:nth-child({position})").all_inner_texts()
            assert np.allclose(_numbers(cells), [ev[s] for s in shown], rtol=2e-3)
        assert "lexical proxy" in page.inner_text("#board-table th[data-column='autointerp/autointerp_score']")
        proxy = page.locator(f"#board-table td:nth-child({columns.index('autointerp/autointerp_score') + 1})")
        assert all(text.endswith("proxy") for text in proxy.all_inner_texts())
        page.check("#board-all")  # every metric column
        assert page.locator("#board-table th").count() == len(board["columns"]) + 1

        # Pareto plots: one point per SAE, the better explained variance drawn higher
        plot = page.locator(f"svg.pareto[data-metric='{EV}']")
        assert plot.get_attribute("data-points") == str(len(sae_ids))
        heights = {c.get_attribute("data-sae"): float(c.get_attribute("cy")) for c in plot.locator("circle").all()}
        best, worst = max(ev, key=ev.get), min(ev, key=ev.get)
        assert heights[best] < heights[worst]
        assert page.locator("svg.pareto").count() >= 6  # core's, mdl's, meta's and autointerp's headline metrics

        # per-letter absorption bars of the SAE with a result: one group per planted letter
        assert page.eval_on_selector("#absorption-sae", "s => s.value") == sae_ids[0]
        bars = page.locator("#absorption-bars")
        assert bars.get_attribute("data-letters") == str(len(PLANTED))
        fraction = {}
        for rect in bars.locator("rect").all():
            title = rect.locator("title").text_content() or ""
            if "mean absorption fraction" in title:
                fraction[title[0]] = float(rect.get_attribute("height"))
        assert set(fraction) == set(PLANTED)
        ratio = np.array([fraction[k] for k in PLANTED]) / np.array(list(PLANTED.values()))
        assert np.allclose(ratio, ratio[0], rtol=1e-3)  # bar heights proportional to the planted fractions
        page.select_option("#absorption-sae", sae_ids[1])  # no absorption result: the command that computes it
        page.wait_for_selector("#absorption .no-result")
        assert "has no absorption result" in page.inner_text("#absorption") and "sae-atlas eval" in page.inner_text("#absorption")
        page.select_option("#absorption-sae", sae_ids[0])
        page.wait_for_selector("#absorption-bars")

        # autointerp: explanations with their scores, named as the lexical proxy
        assert "lexical proxy" in page.inner_text("#autointerp-backend")
        cards = page.locator(".autointerp-latent")
        assert cards.count() >= 2
        assert re.search(r"detection: balanced accuracy [0-9.]+", cards.first.inner_text())
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "board.png"), full_page=True)
        assert not page.errors, page.errors
        assert not page.blocked, page.blocked


def test_one_eval_result_over_http(evaluated: Path, small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][0]
    with LiveServer(evaluated) as live:
        answer = httpx.get(f"{live.url}/saes/{sae}/evals/absorption", timeout=30)
        missing = httpx.get(f"{live.url}/saes/{small_atlas['sae_ids'][1]}/evals/absorption", timeout=30)
        unknown = httpx.get(f"{live.url}/saes/{sae}/evals/ravel", timeout=30)
        no_sae = httpx.get(f"{live.url}/saes/nope/evals/core", timeout=30)
    assert answer.status_code == 200
    body = answer.json()
    assert body["eval_type_id"] == "absorption_first_letter"
    assert {d["first_letter"]: d["mean_absorption_fraction"] for d in body["eval_result_details"]} == pytest.approx(PLANTED)
    assert missing.status_code == 404 and "sae-atlas eval" in missing.json()["detail"]
    assert unknown.status_code == 422 and "absorption" in unknown.text
    assert no_sae.status_code == 404 and "unknown SAE id" in no_sae.json()["detail"]
