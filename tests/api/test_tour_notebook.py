"""examples/tour.ipynb executes top to bottom on the small atlas (nbclient, a real kernel),
so the tour cannot rot."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

TOUR = Path(__file__).resolve().parents[2] / "examples" / "tour.ipynb"


def test_tour_notebook_runs(small_atlas: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install nbformat)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install nbclient ipykernel)")
    atlas = tmp_path / "atlas"
    shutil.copytree(small_atlas["root"], atlas)  # the tour writes a concept run and labels
    monkeypatch.setenv("SAE_ATLAS_TOUR_ATLAS", str(atlas))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TOUR.parents[1]), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(TOUR, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 4  # histogram, contrast, circle, map
    assert (atlas / "analyses" / "concept_search" / "tour-weekdays.json").exists()
