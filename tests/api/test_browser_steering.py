"""The explorer's Steer page in headless Chromium (as tests/api/test_browser.py drives it) on
the small atlas: type a target token, see the features ranked by measured effect with their
held-out results per prompt style, label, density, siblings' ratio and target rank, and the
fitted combination with its weights; click one to fill its edits, and watch the generation
stream in, clean and steered side by side."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import LiveServer
from tests.api.test_browser import ARTIFACTS, _page, browser  # noqa: F401  (the Chromium fixture)
from tests.api.test_steering_http import WAIT, GatedSteps, add_steering_tables

PROMPT = "the cat sat on the"


@pytest.fixture(scope="module")
def steering_server(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server allowing interventions over a copy of the small atlas with steering tables."""
    root = Path(shutil.copytree(small_atlas["root"], tmp_path_factory.mktemp("browser-steering") / "atlas"))
    add_steering_tables(root, small_atlas["sae_ids"])
    with LiveServer(root, allow_interventions=True) as live:
        yield live


def test_steer_toward_a_token(browser: Any, steering_server: LiveServer,  # noqa: F811
                              small_atlas: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    url, sae = steering_server.url, small_atlas["sae_ids"][1]
    page = _page(browser, url)
    page.goto(url + "/#/steering")
    page.wait_for_selector("#steering-target")
    page.fill("#steering-target", "cat")
    page.select_option("#steering-sae", sae)
    page.click("#steering-run")
    page.wait_for_selector("#steering-results table", timeout=WAIT * 1000)
    def _fmt(x: float | None) -> str:  # a number as the page writes it (app.js's fmt)
        return str(page.evaluate("(x) => fmt(x)", x))

    found = httpx.get(url + "/steering/search", params={"token": "cat", "saes": sae, "mode": "add"}, timeout=60).json()
    ranked, combination = found["features"], found["combination"]
    rows = page.locator("#steering-results > table tr")
    assert rows.count() == 1 + len(ranked) and len(ranked) == 10
    header = rows.nth(0).locator("th").all_inner_texts()
    cells = dict(zip(header, rows.nth(1).locator("td").all_inner_texts(), strict=True))
    first = ranked[0]
    assert cells["rank"] == "1" and cells["feature"] == f"{sae} / {first['latent']}" and cells["ratio"].startswith("×")
    held = first["confirmed"]  # the same edit on the held-out prompts, with its interval and share of pairs
    assert cells["held-out"].startswith("×") and cells["held-out"].endswith(f"% of {held['n_prompts']}")
    assert cells["label"] == (first["label"] or "–") and cells["target rank"] == _fmt(first["target_rank"])
    assert cells["density"].startswith(_fmt(first["density"])) and cells["siblings"] == f"×{_fmt(first['sibling_ratio'])}"
    for style, stats in first["confirmed_styles"].items():  # per prompt style: share reached (prompts)
        assert f"{style} {round(100 * stats['share_reached'])}% ({stats['n_prompts']})" in cells["per style"]
    assert found["siblings"] and "siblings" in page.text_content("#steering-context")
    # the fitted combination in the SAE basis: each feature with its weight, label and density
    card = page.locator("#steering-combination")
    assert combination is not None and card.locator("tr").count() == 1 + len(combination["latents"])
    for i, latent in enumerate(combination["latents"]):
        row = card.locator("tr").nth(1 + i).locator("td").all_inner_texts()
        assert row == [f"{sae} / {latent}", combination["labels"][i] or "–", f"{_fmt(combination['weights'][i])} of |resid|",
                       _fmt(combination["densities"][i])]
    best = combination["edits"] if found["best"] == "combination" else [first["edit"]]
    assert json.loads(page.input_value("#steering-edit")) == best  # the best on the held-out prompts, filled in
    page.click("#steering-use-combination")
    assert json.loads(page.input_value("#steering-edit")) == combination["edits"]
    page.locator(".steer-use").nth(1).click()
    [edit] = json.loads(page.input_value("#steering-edit"))
    assert edit == ranked[1]["edit"] and edit["feature"] == ranked[1]["latent"]
    assert ranked[1]["label"] and page.text_content("#steering-generation").startswith(  # the latent's label with it
        f"{sae} / {ranked[1]['latent']} ({ranked[1]['label']}): measured")

    shown = threading.Event()  # the page shows streamed text while step 3 is held back
    GatedSteps(monkeypatch, at=3, release=shown.is_set)
    page.fill("#steering-prompt", PROMPT)
    page.fill("#steering-tokens", "8")
    page.click("#steering-generate")
    page.wait_for_function("document.getElementById('steer-stream-edited')?.textContent.length > 0",
                           timeout=WAIT * 1000)
    assert page.query_selector("#steering-done") is None  # the generation has not ended: it is held at step 3
    shown.set()
    page.wait_for_selector("#steering-done", timeout=WAIT * 1000)
    monkeypatch.undo()
    expected = httpx.post(url + "/steer", json={"text": PROMPT, "edits": [edit], "max_new_tokens": 8}, timeout=60).json()
    assert page.inner_text("#steer-stream-baseline") == expected["baseline_text"].strip()
    assert page.inner_text("#steer-stream-edited") == expected["edited_text"].strip()
    assert page.errors == [] and page.blocked == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "steering.png"), full_page=True)
