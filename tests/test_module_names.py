"""Names that say their job: two modules of the package may share a file name only when they
are the same idea at different layers, and each says so in the first paragraph of its
docstring ("The CLI layer of `search`; its other layers: `sae_atlas.api.services.search`
(service), ..."), naming every other module of its name. A new module that reuses a name
fails here until it is renamed or documented as one more layer."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("api", "saes", "store", "geometry", "sae_atlas")
LAYER = re.compile(r"^The ([\w-]+) layer of `(\w+)`;")


def _dotted(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts) if parts[0] == "sae_atlas" else "sae_atlas." + ".".join(parts)


def _shared_names() -> dict[str, list[Path]]:
    by_name: dict[str, list[Path]] = defaultdict(list)
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if path.name != "__init__.py" and "__pycache__" not in path.parts:
                by_name[path.name].append(path)
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_the_walk_sees_the_known_layered_names() -> None:
    shared = _shared_names()
    assert {"search.py", "graph.py", "maps.py"} <= set(shared)
    assert len(shared["graph.py"]) >= 5


def test_a_module_with_a_name_of_its_own_claims_no_layer() -> None:
    shared = _shared_names()
    stale = [str(path.relative_to(REPO)) for root in ROOTS for path in sorted((REPO / root).rglob("*.py"))
             if path.name not in shared and LAYER.match(ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert not stale, f"a layer line left in a module whose name is its own: {stale}"


def test_modules_sharing_a_file_name_say_which_layer_of_one_idea_they_are() -> None:
    problems = []
    for name, paths in sorted(_shared_names().items()):
        layers: dict[str, Path] = {}
        for path in paths:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            first = doc.split("\n\n", 1)[0]
            match = LAYER.match(first)
            where = path.relative_to(REPO)
            if match is None or match[2] != name[:-3]:
                problems.append(f"{where}: the docstring does not open with 'The <layer> layer of `{name[:-3]}`;'")
                continue
            if match[1] in layers:
                problems.append(f"{where} and {layers[match[1]].relative_to(REPO)} both claim the "
                                f"{match[1]} layer of `{name[:-3]}`: rename one of them")
            layers[match[1]] = path
            missing = [_dotted(o) for o in paths if o != path and f"`{_dotted(o)}`" not in first]
            if missing:
                problems.append(f"{where}: its first paragraph does not name {', '.join(missing)}")
    assert not problems, "\n".join(problems)
