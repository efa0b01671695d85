"""Stored attribution graphs: `sae-atlas graph ... --store RUN` keeps the graph in the atlas,
`GET /graphs` lists it and `GET /graphs/{run}` gives back the graph `--out` wrote; a damaged
file of it is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from sae_atlas.api.cli import app
from sae_atlas.api.services.graphs import stored_graph, stored_graphs
from sae_atlas.errors import IntegrityError
from tests.api.conftest import LiveServer

TEXT = "the cat sat on the mat and the dog"


def test_store_list_read_and_damage(small_atlas: dict[str, Any], tmp_path: Path) -> None:
    root = Path(shutil.copytree(small_atlas["root"], tmp_path / "atlas"))
    out = tmp_path / "graph.json"
    res = CliRunner().invoke(app, ["graph", str(root), TEXT, "--target", "dog", "--out", str(out), "--store", "cats"])
    assert res.exit_code == 0, res.output
    assert "stored analyses/graph/cats" in res.output
    written = json.loads(out.read_text())
    [row] = stored_graphs(root)
    assert row["run"] == "cats" and row["text"] == TEXT and row["targets"] == ["dog"]
    view = stored_graph(root, "cats")
    assert view["graph"] == written  # the nodes, links, metadata and qParams round-trip exactly
    assert row["kept_nodes"] == view["size"]["kept_nodes"] == len(written["nodes"])
    with LiveServer(root) as live:  # read-only: stored graphs need no model and no flag
        assert httpx.get(live.url + "/graphs", timeout=30).json() == [row]
        assert httpx.get(live.url + "/graphs/cats", timeout=30).json()["graph"] == written
        assert httpx.get(live.url + "/graphs/dogs", timeout=30).status_code == 404
    links = root / "analyses" / "graph" / "cats.links.parquet"
    links.write_bytes(links.read_bytes()[:-10])
    with pytest.raises(IntegrityError, match="cats.links.parquet"):
        stored_graph(root, "cats")
