"""The facade's structure: an SAE id is validated once per feature page (Python and HTTP),
and the modules of `api` import one another in layers, without cycles."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sae_atlas import Atlas
from sae_atlas.store.layout import AtlasLayout
from tests.import_graph import assert_no_cycle

API = Path(__file__).resolve().parents[2] / "api"


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every `AtlasLayout.require_sae` call (the SAE-id validation) made while the test runs."""
    seen: list[str] = []
    original = AtlasLayout.require_sae

    def counting(self: AtlasLayout, sae_id: str) -> Path:
        seen.append(sae_id)
        return original(self, sae_id)

    monkeypatch.setattr(AtlasLayout, "require_sae", counting)
    yield seen


def _hot_latent(small_atlas: dict[str, Any], atlas: Atlas, sae_id: str) -> int:
    return int(atlas.features(sae_id).frame.sort("n_active", descending=True)["latent"][0])


def test_a_python_feature_page_validates_its_sae_id_once(small_atlas: dict[str, Any],
                                                          validations: list[str]) -> None:
    atlas = Atlas(small_atlas["root"])
    atlas.preload()
    sae_id = small_atlas["sae_ids"][0]
    latent = _hot_latent(small_atlas, atlas, sae_id)
    atlas.feature(sae_id, latent)  # warm: the lazily loaded files are read once per process
    validations.clear()
    page = atlas.feature(sae_id, latent)
    assert page.cross_layer and page.neighbours  # the page reaches the other SAE and the index
    assert validations.count(sae_id) == 1, validations


def test_an_http_feature_page_validates_its_sae_id_once(small_atlas: dict[str, Any], server: Any,
                                                         validations: list[str]) -> None:
    sae_id = small_atlas["sae_ids"][0]
    url = f"{server.url}/saes/{sae_id}/features/0"
    assert httpx.get(url, timeout=30).status_code == 200  # warm
    validations.clear()
    answer = httpx.get(url, timeout=30)
    assert answer.status_code == 200 and answer.json()["sae_id"] == sae_id
    assert validations.count(sae_id) == 1, validations


def _in_api(module: str) -> bool:
    return module == "sae_atlas.api" or module.startswith("sae_atlas.api.")


def _api_imports() -> dict[str, set[str]]:
    """Module -> the `api` modules it imports (at any level of the file, TYPE_CHECKING included)."""
    graph: dict[str, set[str]] = {}
    for path in API.rglob("*.py"):
        parts = path.relative_to(API.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and _in_api(node.module):
                module = node.module.removeprefix("sae_atlas.")
                targets.add(module)
                targets.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name.removeprefix("sae_atlas.") for alias in node.names if _in_api(alias.name))
        graph[name] = targets
    return {name: {t for t in targets if t in graph and t != name} for name, targets in graph.items()}


def test_api_modules_import_without_cycles() -> None:
    graph = _api_imports()
    assert_no_cycle(graph, "import cycle")


def test_services_never_import_the_facade() -> None:
    graph = _api_imports()
    below = [name for name in graph if name.startswith(("api.services", "api.context", "api.sae_view",
                                                        "api.results", "api.bounds"))]
    assert below
    for name in below:
        assert "api.atlas" not in graph[name] and "api" not in graph[name], name
