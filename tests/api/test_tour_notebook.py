"""examples/tour.ipynb executes top to bottom on the small atlas (nbclient, a real kernel),
so the tour cannot rot, and every capability it tours is reached: each tagged cell must
answer with what that capability gives."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

TOUR = Path(__file__).resolve().parents[2] / "examples" / "tour.ipynb"

# Cell tag -> a text its output must show (the capability answered, not merely ran).
REACHED = {
    "search": "latent",              # the per-token features of a text
    "feature": "examples",           # a feature page (its card)
    "contrast": "auroc",
    "concept": "r2",
    "circle": "r2",
    "labels": "latent",
    "eval": "core",                  # `sae-atlas eval --suite core,mdl` printed its results
    "board": "core/explained_variance",
    "steer": "KL",
    "steer-target": "steering toward",
    "graph": "replacement",
    "graph-intervene": "measured",
    "compare": "MCC",
    "compare-card": "examples",      # B's latent of the best pair, as a feature page
}


def _text(output: Any) -> str:
    """Everything an output shows as text (stream, plain and HTML reprs)."""
    if output.output_type == "stream":
        return output.text
    data = output.get("data", {})
    return data.get("text/plain", "") + data.get("text/html", "")


def _demo_stores(root: Path, sae_ids: list[str]) -> None:
    """What `make demo` leaves that the tour reads: a steering table per SAE (a cheap screen)."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.saes.intervene.output_scores import SteeringParams, compute_steering_scores

    handle = Atlas(root).model()
    for sae_id in sae_ids:
        compute_steering_scores(handle, root, sae_id, SteeringParams(n_prompts=4, prompt_tokens=8, chunk=64),
                                progress=False)


def test_tour_notebook_runs(small_atlas: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install nbformat)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install nbclient ipykernel)")
    atlas = tmp_path / "atlas"
    shutil.copytree(small_atlas["root"], atlas)  # the tour writes a concept run, labels, evals and a comparison
    _demo_stores(atlas, small_atlas["sae_ids"])
    monkeypatch.setenv("SAE_ATLAS_TOUR_ATLAS", str(atlas))
    monkeypatch.setenv("SAE_ATLAS_TOUR_TARGET", "friday")  # the tiny model's word-level vocabulary
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TOUR.parents[1]), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(TOUR, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outputs = [o for cell in code for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # histogram, contrast, circle, board, graph, comparison, map
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 7

    tagged = {tag: cell for cell in code for tag in cell.metadata.get("tags", [])}
    assert set(REACHED) <= set(tagged), f"untagged capabilities: {sorted(set(REACHED) - set(tagged))}"
    for tag, shown in REACHED.items():
        text = "".join(_text(o) for o in tagged[tag].outputs)
        assert shown in text, f"the {tag!r} cell does not show {shown!r}: {text[:500]!r}"

    assert (atlas / "analyses" / "concept_search" / "tour-weekdays.json").exists()
    for sae_id in small_atlas["sae_ids"]:
        assert {"core.json", "mdl.json"} <= {p.name for p in (atlas / "saes" / sae_id / "evals").iterdir()}
    assert (atlas / "analyses" / "compare" / "tour.json").exists()
    graph = json.loads((tmp_path / "tour-graph.json").read_text())
    assert {"metadata", "nodes", "links"} <= set(graph) and graph["nodes"]
