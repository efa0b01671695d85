"""The explorer's Compare page in headless Chromium, over the comparisons and the planted
crosscoder of `test_compare_pages`: one scatter point per matched pair sent, the correlation
histogram beside its null, a click on a pair showing both latents' cards (side B read from the
other atlas), and the crosscoder's relative-norm histogram, its B-only filter and a latent's card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.api.conftest import LiveServer
from tests.api.test_browser import ARTIFACTS, _page, browser  # noqa: F401 (the browser fixture)
from tests.api.test_compare_pages import CC, COPIED, compared  # noqa: F401 (the compared fixture)


def _bin_heights(page: Any) -> list[tuple[int, float]]:
    return [(int(r.get_attribute("data-count")), float(r.get_attribute("height")))
            for r in page.locator("#cc-hist .bin").all()]


def _check_runs_not_ok_are_listed_unlinked(page: Any, url: str, root: Path) -> None:
    """`copy` dropped from runs.json (unregistered) and a table of `layers` broken (damaged):
    both stay listed, without a link, with their status and the problem naming the repair."""
    folder = root / "analyses" / "compare"
    runs, table = folder / "runs.json", folder / "layers.null.parquet"
    saved = {path: path.read_bytes() for path in (runs, table)}
    index = json.loads(saved[runs])
    del index["runs"]["copy"]
    try:
        runs.write_text(json.dumps(index))
        table.write_bytes(b"broken")
        page.goto(url + "/#/compare")
        page.wait_for_selector(".compare-problem.damaged")
        assert page.locator("a.compare-run").count() == 0  # neither can be read, so neither is a link
        assert page.locator(".compare-run-off").all_inner_texts() == ["copy", "layers"]
        unregistered = page.inner_text(".compare-problem.unregistered[data-run='copy']")
        assert unregistered.startswith("unregistered: analyses/compare/copy.json: ")
        assert "sae-atlas register <atlas> --analysis compare/copy" in unregistered
        damaged = page.inner_text(".compare-problem.damaged[data-run='layers']")
        assert damaged.startswith("damaged: analyses/compare/layers.null.parquet: ") and "`sae-atlas compare A B --run layers`" in damaged
        assert str(root) not in page.inner_text("#view")
        page.screenshot(path=str(ARTIFACTS / "compare-problems.png"), full_page=True)
    finally:
        for path, data in saved.items():
            path.write_bytes(data)


def test_compare_page(browser: Any, compared: dict[str, Any]) -> None:  # noqa: F811
    a, b = compared["sae_ids"]
    with LiveServer(compared["root"]) as live:
        sent = {run: httpx.get(f"{live.url}/compare/{run}", params={"pairs": 500}, timeout=30).json()
                for run in ("layers", "copy")}
        page = _page(browser, live.url)
        page.goto(live.url + "/#/compare")
        page.wait_for_selector("a.compare-run")
        assert page.locator("a.compare-run").count() == 2 and page.locator("a.crosscoder-id").count() == 1
        page.click("a.compare-run:text-is('layers')")
        page.wait_for_selector("#pair-scatter")

        # one point per pair sent, the mutual ones filled; scores beside their nulls
        pairs = sent["layers"]["pairs"]
        scatter = page.locator("#pair-scatter")
        assert int(scatter.get_attribute("data-points")) == len(pairs) == page.locator(".pair-point").count() == 64
        assert scatter.get_attribute("data-x") == "decoder_cos"
        assert page.locator(".pair-point.mutual").count() == sum(p["mutual"] for p in pairs)
        scores = page.inner_text("#compare-scores")
        assert "MCC (activation correlation)" in scores and "rotation of B's codes" in scores and "SVCCA" in scores
        assert page.locator("#corr-hist .pair-bar").count() >= 1 and page.locator("#corr-hist .null-bar").count() >= 1

        # a click on a point: both latents' cards, from this atlas
        best = pairs[0]
        page.locator(f".pair-point[data-a='{best['a_latent']}']").click()
        page.wait_for_selector("#card-a .stats")
        page.wait_for_selector("#card-b .stats")
        assert page.locator(".pair-point.picked").get_attribute("data-b") == str(best["b_latent"])
        assert page.inner_text("#card-a h3") == f"A: {a} / {best['a_latent']}"
        assert page.inner_text("#card-b h3") == f"B: {b} / {best['b_latent']}"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)

        # against a copy in another atlas: side B's card is read from that atlas
        page.goto(live.url + "/#/compare/copy")
        page.wait_for_function(f"() => document.querySelector('#compare-title').textContent === '{a} vs {a}'")
        pair = sent["copy"]["pairs"][0]
        page.locator("#pair-table tr.pair-row").first.click()
        page.wait_for_selector("#card-b .stats")
        assert f"B: {a} / {pair['b_latent']} (atlas {compared['other']})" == page.inner_text("#card-b h3")
        assert page.inner_text("#card-a .stats") == page.inner_text("#card-b .stats")  # a copy: the same latent

        # the crosscoder: histogram of every latent with the bands, filtered to B only, a latent's card
        page.goto(live.url + f"/#/crosscoders/{CC}")
        page.wait_for_selector("#cc-hist")
        hist = page.locator("#cc-hist")
        assert hist.get_attribute("data-latents") == "12" and page.locator("#cc-hist .band").count() == 2
        counts = {c: sum(int(r.get_attribute("data-count")) for r in page.locator(f"#cc-hist .bin.{c}").all())
                  for c in ("a_only", "shared", "b_only")}
        assert counts == {"a_only": 4, "shared": 4, "b_only": 4}
        assert page.locator("#cc-latents tr.cc-row").count() == 12
        linear = _bin_heights(page)
        page.check("#cc-log")  # log heights: the same bins, the lower ones raised relative to the tallest
        page.wait_for_selector("#cc-hist[data-log='true']")
        logged = _bin_heights(page)
        assert [c for c, _ in logged] == [c for c, _ in linear] and len(set(c for c, _ in linear)) > 1
        top = max(c for c, _ in linear)
        for (count, h_lin), (_, h_log) in zip(linear, logged, strict=True):
            assert h_log / max(h for _, h in logged) == pytest.approx(np.log10(1 + count) / np.log10(1 + top))
            assert h_lin / max(h for _, h in linear) == pytest.approx(count / top)
        page.select_option("#cc-class", "b_only")
        page.wait_for_function("() => document.querySelectorAll('#cc-latents tr.cc-row').length === 4")
        classes = page.eval_on_selector_all("#cc-latents tr.cc-row", "trs => trs.map((tr) => tr.dataset.class)")
        assert classes == ["b_only"] * 4
        assert "nu_error" in page.inner_text("#cc-latents")
        page.locator("#cc-latents tr.cc-row").first.click()
        page.wait_for_selector("#cc-card .nearest-b")
        latent = int(page.get_attribute("#cc-card", "data-latent"))
        norms = page.inner_text("#cc-norms")
        assert "decoder norm, side A" in norms and "decoder norm, side B" in norms and "B only" in norms
        assert f"/ {COPIED['b'][latent - 4]}" in page.locator("#cc-card .nearest-b tr").nth(1).inner_text()
        page.screenshot(path=str(ARTIFACTS / "compare-crosscoder.png"), full_page=True)
        _check_runs_not_ok_are_listed_unlinked(page, live.url, compared["root"])
        assert not page.errors, page.errors
        assert not page.blocked, page.blocked
