"""Every explorer page of a demo-like atlas in headless Chromium, served exactly as the
demo's closing lines serve it (`api.services.demo.serve_argv`, in a subprocess).

The atlas is the small test atlas plus what the demo adds for the explorer, by the demo's
own functions: the suite's `core` eval (`core_evals`), steering tables, a stored graph and
a comparison (`explorer_content`). A page fails the walk when it shows an error or a
refusal, says it needs something, is empty, contains a replacement character, or selects a
special token (BOS) by default. A server without the flag shows, before any click, the
command each model page needs, and no control that could only be refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import free_port
from tests.api.test_browser import CHROMIUM_ARGS, _chromium, _page

GRAPH = ("the cat sat on the mat and the dog", "dog")
WALK_TEXT = "the cat sat on the mat on monday"
REFUSALS = ("not allow", "refus", "interventions are off", "needs a server", "no steering table")


@pytest.fixture(scope="module")
def demo_like(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the small atlas with the demo's explorer steps run on it."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.api.services.demo import core_evals, explorer_content

    root = Path(shutil.copytree(small_atlas["root"], tmp_path_factory.mktemp("walk") / "atlas-demo"))
    atlas = Atlas(root)
    handle = atlas.model()
    ids = small_atlas["sae_ids"]
    core_evals(atlas.ctx, ids, None, lambda shown: None)
    explorer_content(atlas.ctx, ids, lambda shown: None, graph=GRAPH)
    latent, label = next((i, f.label) for i in range(small_atlas["d_sae"]) if (f := atlas.feature(ids[1], i)).label)
    return {"root": root, "sae_ids": ids, "latent": latent, "word": label.split()[0].strip(",;:'\""),
            "compare": atlas.comparisons()[0]["run"], "special": set(handle.tokenizer.all_special_tokens)}


@pytest.fixture(scope="module")
def demo_server(demo_like: dict[str, Any]) -> Iterator[str]:
    """`sae-atlas serve ...` as the demo prints it, on a free port."""
    from sae_atlas.api.services.demo import serve_argv

    argv = serve_argv(demo_like["root"])
    assert argv[:2] == ["sae-atlas", "serve"]
    port = free_port()
    script = Path(sys.executable).with_name("sae-atlas")
    process = subprocess.Popen([str(script), *argv[1:], "--port", str(port), "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "the demo's serve command did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _open(page: Any, url: str, hash_: str, ready: str) -> str:
    """Open a page, wait for `ready` and for its requests; the view's text."""
    page.goto(url + "/" + hash_)
    page.wait_for_selector(ready, timeout=120_000)
    page.wait_for_function("document.getElementById('status').textContent === ''", timeout=120_000)
    return page.inner_text("#view")


def _check(page: Any, name: str, text: str) -> None:
    """The walk's verdict on one page."""
    assert len(text.strip()) > 40, f"{name}: (nearly) empty page: {text!r}"
    assert "\ufffd" not in page.inner_text("body"), f"{name}: replacement character on the page"
    assert "[object " not in text, f"{name}: an element printed as text"
    errors = page.locator("#view .error").all_inner_texts()
    assert not errors, f"{name}: {errors}"
    notices = page.locator("#view .notice").all_inner_texts()
    assert not notices, f"{name}: says it needs something: {notices}"
    lowered = text.lower()
    assert not [r for r in REFUSALS if r in lowered], f"{name}: refusal on the page: {text[:400]!r}"


def test_every_page_has_content(browser: Any, demo_server: str, demo_like: dict[str, Any]) -> None:
    url, sae = demo_server, demo_like["sae_ids"][1]
    page = _page(browser, url)
    # Text: run a sentence; the token selected by default is a real one, never BOS
    _open(page, url, "#/", "#run-text")
    page.fill("#text-input", WALK_TEXT)
    page.click("#run-text")
    page.wait_for_selector(".tokens .tok.selected", timeout=120_000)
    assert page.inner_text(".tokens .tok.selected") not in demo_like["special"]
    _check(page, "text", page.inner_text("#view"))
    pages = [
        ("saes", "#/saes", "table a.feat"),
        ("feature list", f"#/saes/{sae}", "table a.feat"),
        ("feature", f"#/saes/{sae}/features/{demo_like['latent']}", "#examples"),
        ("map", f"#/map/{sae}", "#map-canvas[data-points]"),
        ("geometry", "#/analyses", "table a.feat"),
        ("geometry run", "#/analyses/planted/demo-run", "#figures img"),
        ("labels", f"#/labels?q={demo_like['word']}", "#label-hits table"),
        ("attribute", "#/attribute", "#attr-run"),
        ("graph", "#/graph", "#graph-svg"),
        ("board", "#/board", "#board-table"),
        ("steer", "#/steering", "#steering-run"),
        ("compare list", "#/compare", "a.compare-run"),
        ("comparison", f"#/compare/{demo_like['compare']}", "#pair-scatter"),
    ]
    for name, hash_, ready in pages:
        _check(page, name, _open(page, url, hash_, ready))
    # the feature page's steer box, its alpha rounded to 3 significant digits
    _open(page, url, f"#/saes/{sae}/features/{demo_like['latent']}", "#steer-box")
    alpha = page.input_value("#steer-alpha")
    assert len(alpha.replace("-", "").replace(".", "").lstrip("0")) <= 3, alpha
    # the board: every SAE with its core metrics; the SAEs page shows the same FVU
    _open(page, url, "#/board", "#board-table")
    assert page.locator("#board-table tr[data-sae]").count() == len(demo_like["sae_ids"])
    # the model pages work on a click too
    _open(page, url, "#/attribute", "#attr-run")
    page.click("#attr-run")
    page.wait_for_selector("#attr-complete, #attr-results .error", timeout=120_000)
    _check(page, "attribute (run)", page.inner_text("#view"))
    _open(page, url, "#/steering", "#steering-run")
    page.fill("#steering-target", "friday")
    page.click("#steering-run")
    page.wait_for_selector("#steering-results table, #steering-results .error", timeout=300_000)
    _check(page, "steer (ranked)", page.inner_text("#view"))
    assert not page.errors, page.errors
    assert not page.blocked, page.blocked


def test_board_and_saes_page_agree(browser: Any, demo_server: str, demo_like: dict[str, Any]) -> None:
    """One record of the evaluation: the SAEs page's FVU is the Board's core/fvu."""
    board = httpx.get(demo_server + "/board", timeout=30).json()
    fvu = {row["sae_id"]: row["metrics"]["core/fvu"] for row in board["rows"]}
    assert all(value is not None for value in fvu.values())
    page = _page(browser, demo_server)
    _open(page, demo_server, "#/saes", "table a.feat")
    headers = page.locator("#view table tr").first.locator("th").all_inner_texts()
    column = headers.index("fvu")
    for row in page.locator("#view table tr").all()[1:]:
        cells = row.locator("td").all_inner_texts()
        shown = float(cells[column])
        assert shown == pytest.approx(fvu[cells[0].split()[0]], rel=5e-3)


def test_without_the_flag_pages_say_what_they_need(browser: Any, server: Any, small_atlas: dict[str, Any]) -> None:
    """A read-only server (no --allow-interventions, no steering table, no stored graph, no eval):
    the model pages name the command before any click and show no control that would be refused."""
    page = _page(browser, server.url)
    for hash_, control in (("#/attribute", "#attr-run"), ("#/steering", "#steering-run")):
        text = _open(page, server.url, hash_, "#needs-interventions")
        assert "sae-atlas serve <atlas> --allow-interventions" in text
        assert page.locator(control).count() == 0
    text = _open(page, server.url, "#/graph", "#needs-graph")
    assert "--store" in text and page.locator("#graph-build").count() == 0
    assert "sae-atlas serve <atlas> --allow-interventions" in page.inner_text("#needs-interventions")
    assert "sae-atlas eval <atlas> --suite core" in _open(page, server.url, "#/board", "#needs-eval")
    _open(page, server.url, f"#/saes/{small_atlas['sae_ids'][0]}/features/3", "#examples")
    assert page.locator("#steer-box").count() == 0
    assert not page.errors, page.errors
