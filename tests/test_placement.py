"""Persistence lives in `store`, maths in `geometry`: geometry imports nothing from the
store, the engines or the facade (it computes; `store` writes and reads what it computes),
and the store imports no engine or facade module."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _imports(folder: str) -> dict[str, set[str]]:
    """Module file -> every `sae_atlas` module it imports, at any level of the file."""
    out: dict[str, set[str]] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        out[str(path.relative_to(REPO))] = {m for m in found if m.startswith("sae_atlas.")}
    return out


def _reaching(folder: str, banned: tuple[str, ...]) -> list[str]:
    return [f"{name} imports {module}" for name, modules in _imports(folder).items()
            for module in sorted(modules) if module.startswith(banned)]


def test_geometry_is_maths_and_imports_no_store_engine_or_facade() -> None:
    assert _imports("geometry")  # the walk sees the package
    assert not _reaching("geometry", ("sae_atlas.store", "sae_atlas.saes", "sae_atlas.api"))


def test_the_store_imports_no_engine_or_facade() -> None:
    assert not _reaching("store", ("sae_atlas.saes", "sae_atlas.api"))
