"""The web explorer in headless Chromium (Playwright driving Debian's /usr/bin/chromium):
type a text, click a feature, see its examples and neighbours, open the map."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import LiveServer

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _chromium() -> str:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("no Chromium found (install it with `apt-get install -y chromium`)")


@pytest.fixture(scope="module")
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    executable = _chromium()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _page(browser: Any, url: str) -> Any:
    """A page that may reach only `url`, with the page errors (`errors`) and the requests it
    tried to send elsewhere (`blocked`)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    blocked: list[str] = []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(url)
                  else (blocked.append(route.request.url), route.abort()))
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    page.blocked = blocked
    return page


@pytest.fixture(scope="module")
def page(browser: Any, server: Any) -> Any:
    return _page(browser, server.url)


def test_text_feature_neighbours_and_map(page: Any, server: Any, small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][1]
    page.goto(server.url + "/")
    page.wait_for_selector("#text-input")
    page.select_option("#text-sae", sae)
    page.fill("#text-input", "the cat sat on the mat on monday")
    page.click("#run-text")
    page.wait_for_selector(".tokens .tok")
    tokens = page.locator(".tokens .tok").all_inner_texts()
    assert tokens[:3] == ["the", "cat", "sat"]  # BOS left out
    page.locator(".tokens .tok").nth(1).click()
    assert page.inner_text("#token-features h3") == 'token 2: "cat"'
    assert "label" in page.locator("#token-features th").all_inner_texts()
    assert any("fires on" in t or "promotes" in t for t in page.locator("#token-features td").all_inner_texts())
    link = page.locator("#token-features a.feat").first
    latent = int(link.inner_text().split()[-1])
    link.click()
    page.wait_for_selector("#examples")
    assert page.inner_text("#feature-title") == f"{sae} / feature {latent}"
    assert page.locator("#examples .example").count() >= 1 or "never fired" in page.inner_text("#examples")
    assert page.locator("#neighbours a.feat").count() >= 3
    assert page.locator("#cross-layer a.feat").count() >= 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer.png"), full_page=True)
    # follow a neighbour link: another feature page
    first = page.locator("#neighbours a.feat").first
    neighbour = int(first.inner_text().split()[-1])
    first.click()
    page.wait_for_function(f"document.querySelector('#feature-title')?.textContent.endsWith('feature {neighbour}')")
    # the map: points drawn, hover shows a latent, click opens its feature page
    page.goto(server.url + f"/#/map/{sae}")
    canvas = page.wait_for_selector("#map-canvas[data-points]")
    assert canvas.get_attribute("data-points") == str(small_atlas["d_sae"])
    box = canvas.bounding_box()
    hit = page.evaluate("""() => {
        const c = document.getElementById('map-canvas'), ctx = c.getContext('2d');
        const d = ctx.getImageData(0, 0, c.width, c.height).data;
        for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {
            const i = 4 * (y * c.width + x);
            if (d[i + 3] > 200) return [x, y];
        }
        return null; }""")
    assert hit is not None, "no points drawn on the map"
    page.mouse.move(box["x"] + hit[0], box["y"] + hit[1])
    assert page.inner_text("#map-tip").startswith("latent ")
    page.mouse.click(box["x"] + hit[0], box["y"] + hit[1])
    page.wait_for_selector("#feature-title")
    page.screenshot(path=str(ARTIFACTS / "explorer-map-click.png"))
    # the basis toggle lists both bases with their kNN-overlap scores and redraws the map
    page.goto(server.url + f"/#/map/{sae}")
    page.wait_for_selector("#map-canvas[data-basis='decoder']")
    options = page.eval_on_selector_all("#map-basis option", "os => os.map((o) => [o.value, o.textContent])")
    assert [v for v, _ in options] == ["decoder", "cooccurrence"] and all("kNN overlap" in t for _, t in options)
    page.select_option("#map-basis", "cooccurrence")
    page.wait_for_selector("#map-canvas[data-basis='cooccurrence']")
    assert "cooccurrence layout" in page.inner_text("#map-note")
    # geometry results with their figure
    page.goto(server.url + "/#/analyses/planted/demo-run")
    page.wait_for_selector("#figures img")
    assert page.evaluate("document.querySelector('#figures img').naturalWidth") > 0
    assert not page.errors, page.errors
    assert not page.blocked, f"the explorer tried to reach outside the server: {page.blocked}"


def test_feature_url_opens_explorer(page: Any, server: Any, small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][0]
    page.goto(server.url + f"/saes/{sae}/features/5")
    page.wait_for_selector("#feature-title")
    assert page.inner_text("#feature-title") == f"{sae} / feature 5"


def test_unregistered_sae_and_run_are_shown(browser: Any, small_atlas: dict[str, Any], tmp_path: Path) -> None:
    """An SAE atlas.json does not list and a run its runs.json does not list are marked
    "unregistered" with the command that registers them again: in the SAE list, on the
    SAE's feature pages and in the geometry results."""
    root = Path(shutil.copytree(small_atlas["root"], tmp_path / "atlas"))
    sae = small_atlas["sae_ids"][0]
    meta = json.loads((root / "atlas.json").read_text())
    del meta["saes"][sae]
    (root / "atlas.json").write_text(json.dumps(meta))
    runs_json = root / "analyses" / "planted" / "runs.json"
    runs_json.write_text(json.dumps({**json.loads(runs_json.read_text()), "runs": {}}))
    with LiveServer(root) as live:
        page = _page(browser, live.url)
        page.goto(live.url + "/#/saes")
        page.wait_for_selector("#sae-problems")
        problems = page.inner_text("#sae-problems")
        assert f"{sae} (unregistered)" in problems and f"sae-atlas register <atlas> --sae {sae}" in problems
        assert page.locator("span.unregistered").count() == 1
        page.goto(live.url + f"/#/saes/{sae}/features/3")
        page.wait_for_selector("#unregistered-mark")
        assert "sae-atlas register" in page.inner_text("#unregistered-mark")
        page.goto(live.url + "/#/analyses")
        page.wait_for_selector(".error.unregistered")
        assert "unregistered: " in page.inner_text(".error.unregistered")
        assert "--analysis planted/demo-run" in page.inner_text(".error.unregistered")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "explorer-unregistered.png"), full_page=True)
        assert not page.errors, page.errors
        assert not page.blocked, page.blocked
