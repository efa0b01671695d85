"""Screenshots of every explorer page of an atlas (the demo's), served as the demo's closing
lines serve it, for docs/pages/: one 64-colour PNG per page (the Depth page shows the atlas's
first stored depth run, `sae-atlas analyze depth`).

    PYTHONPATH=. python bench/explorer_screenshots.py --atlas atlas-demo --out docs/pages

Drives Debian's Chromium through Playwright (as the browser tests do). The Text, Attribute
and Steer pages are shown after one run each (the model runs on the CPU: minutes under load).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import httpx
from PIL import Image
from playwright.sync_api import sync_playwright

from sae_atlas.api.services.demo import DEMO_TEXT, serve_argv
from tests.api.conftest import free_port
from tests.api.test_browser import CHROMIUM_ARGS, _chromium

COLOURS = 64
WAIT_MS = 900_000


def _serve(atlas: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    script = Path(sys.executable).with_name("sae-atlas")
    process = subprocess.Popen([str(script), *serve_argv(atlas)[1:], "--port", str(port), "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.5)
    process.terminate()
    raise SystemExit("the server did not start")


def _save(page: object, path: Path) -> None:
    """A full-page screenshot cut to 1600 px and reduced to 64 colours."""
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    image = Image.open(path).convert("RGB")
    image = image.crop((0, 0, image.width, min(image.height, 1600)))
    image.quantize(COLOURS, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path}: {path.stat().st_size // 1024} kB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--atlas", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("docs/pages"))
    parser.add_argument("--word", default="Friday", help="label word: the Labels page and the feature shown")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    process, url = _serve(args.atlas)
    try:
        saes = httpx.get(url + "/saes", timeout=60).json()
        sae = saes[len(saes) // 2]["sae_id"]
        hits = httpx.get(url + "/search/labels", params={"q": args.word, "sae_id": sae, "k": 1}, timeout=60).json()
        latent = hits[0]["latent"] if hits else 0
        runs = httpx.get(url + "/analyses", timeout=60).json()
        compare = httpx.get(url + "/compare", timeout=60).json()
        depth = [r for r in httpx.get(url + "/depth", timeout=60).json() if r["status"] == "ok"]
        pages = [
            ("saes", "#/saes", "table a.feat"),
            ("features", f"#/saes/{sae}", "table a.feat"),
            ("feature", f"#/saes/{sae}/features/{latent}", "#examples"),
            ("map", f"#/map/{sae}?highlight={latent}", "#map-canvas[data-points]"),
            ("geometry", "#/analyses", "table a.feat"),
            ("labels", f"#/labels?q={args.word}", "#label-hits"),
            ("graph", "#/graph", "#graph-svg, .notice"),
            ("board", "#/board", "#board-table"),
            ("compare", "#/compare", "#view table, #view .muted"),
        ]
        circular = next((r for r in runs if r["kind"] == "circular"), None)
        if circular:
            pages.append(("geometry-run", f"#/analyses/circular/{circular['run']}", "#figures"))
        if compare:
            pages.append(("comparison", f"#/compare/{compare[0]['run']}", "#pair-scatter"))
        depth.sort(key=lambda r: r["kind"] != "corpus")  # a corpus run first, else a families run
        pages.append(("depth", f"#/depth/{depth[0]['run']}", "#depth-cka, #family-lid") if depth
                     else ("depth", "#/depth", "#depth-none"))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(WAIT_MS)
            page.goto(url + "/#/")
            page.fill("#text-input", DEMO_TEXT)
            page.click("#run-text")
            page.wait_for_selector(".tokens .tok.selected")
            _save(page, args.out / "text.png")
            for name, hash_, ready in pages:
                page.goto(url + "/" + hash_)
                page.wait_for_selector(f"{ready}, #view .error, #view .notice")  # a page that names what it lacks
                page.wait_for_function("document.getElementById('status').textContent === ''")
                _save(page, args.out / f"{name}.png")
            page.goto(url + "/#/attribute")
            page.click("#attr-run")
            page.wait_for_selector("#attr-complete, #attr-results .error")
            _save(page, args.out / "attribute.png")
            page.goto(url + "/#/steering")
            page.wait_for_selector("#steering-run, .notice")
            if page.locator("#steering-run").count():
                page.click("#steering-run")
                page.wait_for_selector("#steering-results table, #steering-results .error")
            _save(page, args.out / "steer.png")
            browser.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
