"""The explorer's Steer page in headless Chromium (as tests/api/test_browser.py drives it) on
the small atlas: type a target token, see the features ranked by measured effect, click one
to fill its edit, and watch the generation stream in, clean and steered side by side."""

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
    ranked = httpx.get(url + "/steering/search", params={"token": "cat", "sae_id": sae, "mode": "add"},
                       timeout=60).json()["features"]
    rows = page.locator("#steering-results table tr")
    assert rows.count() == 1 + len(ranked) and len(ranked) == 10
    cells = rows.nth(1).locator("td").all_inner_texts()
    assert cells[0] == "1" and cells[1] == f"{sae} / {ranked[0]['latent']}" and cells[3].startswith("×")
    assert json.loads(page.input_value("#steering-edit")) == ranked[0]["edit"]  # the best one, filled in
    page.locator(".steer-use").nth(1).click()
    edit = json.loads(page.input_value("#steering-edit"))
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
