"""The subpackages of `saes` import one another in one direction: their import graph (any
import, at any level of a file) has no cycle, so no import climbs back up from a lower
subpackage to one that builds on it (train stays below eval, transcoders and compare;
encoding below intervene; formats below transcoders)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import assert_no_cycle

SAES = Path(__file__).resolve().parents[2] / "saes"


def _subpackage_imports() -> dict[str, set[str]]:
    """Subpackage -> the other subpackages its modules import."""
    packages = {p.name for p in SAES.iterdir() if (p / "__init__.py").is_file()}
    graph: dict[str, set[str]] = {name: set() for name in packages}
    for name in packages:
        for path in (SAES / name).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                           [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for module in modules:
                    parts = module.split(".")
                    if parts[:2] == ["sae_atlas", "saes"] and len(parts) > 2 and parts[2] in packages:
                        graph[name].add(parts[2])
        graph[name].discard(name)
    return graph


def test_saes_subpackages_import_without_cycles() -> None:
    graph = _subpackage_imports()
    assert {"train", "eval", "transcoders"} <= graph.keys() and "sae" in graph["train"]
    assert_no_cycle(graph, "saes subpackages import in a cycle")


def test_the_lower_subpackages_do_not_import_the_higher() -> None:
    graph = _subpackage_imports()
    assert not graph["train"] & {"eval", "transcoders", "compare"}
    assert "intervene" not in graph["encoding"] and "transcoders" not in graph["formats"]
    assert graph["sae"] == set()
