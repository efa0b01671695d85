"""Attribution graphs through the Atlas facade, the CLI and the real HTTP server (small atlas:
residual-stream SAEs on a tiny Llama), with planted geometry supernodes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import polars as pl
import pytest
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.bounds import MAX_GRAPH_TOKENS
from sae_atlas.api.cli import app
from sae_atlas.api.services.graph import graph_saes
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.store.feature_records import write_records
from tests.api.conftest import LiveServer

TEXT = "the cat sat on the mat and the dog"
SCHEMA = json.loads((Path(__file__).parents[1] / "fixtures/graphs/circuit-tracer-graph.schema.json").read_text())


@pytest.fixture(scope="module")
def planted(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the small atlas whose second SAE has a stored 'circle' of three latents that
    fire on TEXT (geometry records, as a circular discovery run writes them)."""
    root = tmp_path_factory.mktemp("graph") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    sid = small_atlas["sae_ids"][1]
    g = Atlas(root).graph(TEXT, "dog", supernodes=False).circuit
    d = g.dictionaries.index(sid)
    active = g.features.latent[(g.features.dictionary == d) & (g.features.pos == g.n_pos - 1)].tolist()
    circle = sorted(set(active))[:3]
    rows = [{"sae_id": sid, "latent": lat, "kind": "circle", "run": "planted", "group": 0, "name": "cluster 0",
             "in_circle": True, "period": 7.0, "score": 0.9} for lat in circle]
    write_records(root, sid, "geometry", pl.DataFrame(rows))
    return {**small_atlas, "root": root, "circle": circle, "sid": sid}


def test_atlas_graph_with_geometry_supernodes(planted):
    atlas = Atlas(planted["root"])
    view = atlas.graph(TEXT, "dog", interventions=[])
    assert view.kind == "residual" and not view.linear and view.dictionaries == planted["sae_ids"]
    assert [t["token"] for t in view.targets] == ["dog"]
    assert view.size["kept_nodes"] < view.size["nodes"] and view.size["kept_edges"] < view.size["edges"]
    assert 0 < view.scores["replacement"] <= 1 and 0 < view.scores["completeness"] <= 1
    jsonschema.validate(view.graph, SCHEMA)
    label = f"circle cluster 0 ({planted['sid']}, planted)"
    (sn,) = [s for s in view.supernodes if s[0] == label]
    members = {int(n.split("_")[1]) for n in sn[1:]}
    assert members <= set(planted["circle"])
    payload = view.to_dict()
    json.dumps(payload)
    assert "circuit" not in payload and "attribution graph" in view._repr_html_()
    # a supernode and a single feature node, edited in the replacement model
    node = next(n["node_id"] for n in view.top_nodes if n["kind"] == "feature")
    edited = atlas.graph(TEXT, "dog", interventions=[{"node": label, "kind": "ablate"},
                                                     {"node": node, "kind": "steer", "value": 1e-3,
                                                      "recompute": False}])
    ablate, steer = edited.interventions
    assert ablate["node"] == label and len(ablate["measured"]) == 1 and ablate["measured"][0] != 0
    # features fixed and a small step: the change is the graph's first-order edge
    assert steer["measured"][0] == pytest.approx(steer["direct"][0], rel=0.05, abs=1e-6)
    with pytest.raises(InvalidInputError, match="not a feature node or supernode"):
        atlas.graph(TEXT, "dog", interventions=[{"node": "E_1_0", "kind": "ablate"}])


def test_bad_input_is_named(planted):
    atlas = Atlas(planted["root"])
    with pytest.raises(InvalidInputError, match="not in the model's vocabulary"):
        atlas.graph(TEXT, "zebra")
    with pytest.raises(InvalidInputError, match=f"at most {MAX_GRAPH_TOKENS}"):
        atlas.graph(" ".join(["the"] * MAX_GRAPH_TOKENS), "dog")
    with pytest.raises(NotFoundError, match="no transcoder or residual-stream SAE"):
        graph_saes(atlas.ctx, [], chosen=False)
    with pytest.raises(InvalidInputError, match="node_threshold"):
        atlas.graph(TEXT, "dog", node_threshold=1.5)


def test_cli_writes_the_graph_json(planted, tmp_path):
    out = tmp_path / "g.json"
    res = CliRunner().invoke(app, ["graph", str(planted["root"]), TEXT, "--target", "dog", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "replacement" in res.output and f"wrote {out}" in res.output
    jsonschema.validate(json.loads(out.read_text()), SCHEMA)
    res = CliRunner().invoke(app, ["graph", str(planted["root"]), TEXT, "--target", "zebra", "--out", str(out)])
    assert res.exit_code != 0 and "vocabulary" in res.output


def test_http_graph(planted):
    with LiveServer(planted["root"]) as closed:
        assert httpx.post(closed.url + "/graph", json={"text": TEXT}, timeout=60).status_code == 403
    with LiveServer(planted["root"], allow_interventions=True) as live:
        r = httpx.post(live.url + "/graph", json={"text": TEXT, "targets": ["dog"]}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        jsonschema.validate(body["graph"], SCHEMA)
        assert body["targets"][0]["token"] == "dog" and body["supernodes"]
        r = httpx.post(live.url + "/graph", json={"text": TEXT, "targets": ["zebra"]}, timeout=60)
        assert r.status_code == 400 and "vocabulary" in r.text
        r = httpx.post(live.url + "/graph", json={"text": TEXT, "targets": ["dog"] * 11}, timeout=60)
        assert r.status_code == 422
