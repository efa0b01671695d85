"""The explorer's Graph page in headless Chromium: build a graph over the small atlas, its
layered drawing, collapsing the planted supernode, pinning, and a click to a feature page."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import LiveServer
from tests.api.test_browser import ARTIFACTS, CHROMIUM_ARGS, _chromium, _page
from tests.api.test_graph import TEXT, planted  # noqa: F401


def test_graph_page(planted: dict[str, Any]) -> None:  # noqa: F811
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with LiveServer(planted["root"], allow_interventions=True) as live, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        page = _page(browser, live.url)

        def model_layers(route: Any) -> None:  # the rows are named by the dictionaries' model layers, say 8 and 15
            response = route.fetch()
            body = response.json()
            for d, layer in zip(body["graph"]["metadata"]["sae_atlas"]["dictionaries"], (8, 15), strict=True):
                d["layer"] = layer
            route.fulfill(response=response, json=body)

        page.route("**/graph", model_layers)
        page.goto(live.url + "/#/graph")
        page.wait_for_selector("#graph-prompt")
        page.fill("#graph-prompt", TEXT)
        page.fill("#graph-target", "dog")
        page.click("#graph-build")
        page.wait_for_selector("#graph-svg")
        plot = page.locator("#graph-svg")
        n_nodes, n_links = int(plot.get_attribute("data-nodes")), int(plot.get_attribute("data-links"))
        assert n_nodes == page.locator(".graph-node").count() > 5
        assert n_links == page.locator(".graph-link").count() > 5
        assert "replacement" in page.inner_text("#graph-summary")
        assert page.locator(".graph-row").all_text_contents() == ["Emb", "L8", "L15", "Lgt"]  # no empty row
        assert page.locator(".graph-node.logit").count() == 1 and page.locator(".graph-node.embedding").count() >= 9
        # the heaviest edge is drawn widest
        widths = {float(e.get_attribute("stroke-width")): abs(float(e.get_attribute("data-weight")))
                  for e in page.locator(".graph-link").all()}
        assert widths[max(widths)] == max(widths.values())
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "graph.png"), full_page=True)
        # the planted circle collapses into one supernode with fewer nodes drawn
        page.check("#graph-collapse")
        page.wait_for_selector(".graph-node.supernode")
        assert int(page.locator("#graph-svg").get_attribute("data-nodes")) < n_nodes
        page.uncheck("#graph-collapse")
        page.wait_for_selector(".graph-node.cross-layer-transcoder")
        # shift-click pins a node; a click opens the feature's page
        node = page.locator(".graph-node.cross-layer-transcoder").first
        node_id = node.get_attribute("data-node")
        node.click(modifiers=["Shift"])
        page.wait_for_selector(f".graph-node.pinned[data-node='{node_id}']")
        assert node_id in page.inner_text("#graph-pinned")
        page.locator(f".graph-node[data-node='{node_id}']").click()
        page.wait_for_function("() => location.hash.includes('/features/')")
        layer, latent, _ = node_id.split("_")
        assert page.evaluate("location.hash").endswith(f"/features/{latent}")
        assert not page.errors, page.errors
        assert not page.blocked, page.blocked
        browser.close()
