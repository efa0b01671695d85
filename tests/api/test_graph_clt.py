"""Graphs over an atlas's cross-layer transcoder through the Atlas facade, the CLI and HTTP:
the atlas's only CLT is picked by default (an exact CLT of a tiny ReLU model: scores 1),
`clt` chooses among several, and bad choices are named."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.models import load_model
from sae_atlas.saes.transcoders.clt_store import clt_record, register_clt, save_clt
from sae_atlas.store.layout import AtlasLayout
from tests.api.conftest import LiveServer
from tests.saes.graph_fixtures import PROMPT, exact_clt, random_clt

SPEC = {"kind": "tiny", "arch": "gpt2", "n_layers": 2, "seed": 0, "act_fn": "relu"}
SCHEMA = json.loads((Path(__file__).parents[1] / "fixtures/graphs/circuit-tracer-graph.schema.json").read_text())


def _store(root: Path, clt_id: str, clt) -> None:
    save_clt(clt.float(), AtlasLayout(root).clt_dir(clt_id))
    register_clt(root, clt_record(clt_id, clt.cfg, {}))


@pytest.fixture(scope="module")
def atlas(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clt-graph") / "atlas"
    AtlasLayout(root).write_meta({"model": SPEC, "model_name": "tiny"})
    _store(root, "clt-exact", exact_clt(load_model(SPEC, cache=False)))
    return root


def test_the_atlas_clt_is_the_default(atlas):
    assert Atlas(atlas).clt_ids == ["clt-exact"]
    view = Atlas(atlas).graph(PROMPT, supernodes=False)
    assert view.kind == "clt" and view.linear and view.dictionaries == ["clt-exact@0", "clt-exact@1"]
    assert view.scores["replacement"] == pytest.approx(1.0, abs=1e-4)
    jsonschema.validate(view.graph, SCHEMA)
    features = [n for n in view.graph["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert features and all("sae_id" not in n and n["dictionary"].startswith("clt-exact@") for n in features)
    node = next(n["node_id"] for n in view.top_nodes if n["kind"] == "feature")
    edited = Atlas(atlas).graph(PROMPT, supernodes=False, interventions=[{"node": node, "kind": "ablate"}])
    assert edited.interventions[0]["measured"] == pytest.approx(edited.interventions[0]["total"], abs=1e-3)


def test_cli_http_and_choosing_among_clts(atlas, tmp_path):
    out = tmp_path / "g.json"
    res = CliRunner().invoke(app, ["graph", str(atlas), PROMPT, "--clt", "clt-exact", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("clt graph") and json.loads(out.read_text())["nodes"]
    with LiveServer(atlas, allow_interventions=True) as live:
        r = httpx.post(live.url + "/graph", json={"text": PROMPT, "clt": "clt-exact"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["kind"] == "clt"
        r = httpx.post(live.url + "/graph", json={"text": PROMPT, "clt": "nope"}, timeout=60)
        assert r.status_code == 404 and "unknown CLT id" in r.text
    two = tmp_path / "two"
    AtlasLayout(two).write_meta({"model": SPEC, "model_name": "tiny"})
    handle = load_model(SPEC, cache=False)
    _store(two, "clt-a", exact_clt(handle))
    _store(two, "clt-b", random_clt(handle))
    with pytest.raises(InvalidInputError, match="several cross-layer transcoders"):
        Atlas(two).graph(PROMPT)
    assert Atlas(two).graph(PROMPT, clt="clt-b", supernodes=False).dictionaries == ["clt-b@0", "clt-b@1"]
    with pytest.raises(NotFoundError, match="valid: clt-a, clt-b"):
        Atlas(two).graph(PROMPT, clt="clt-c")
    with pytest.raises(InvalidInputError, match="not both"):
        Atlas(two).graph(PROMPT, clt="clt-a", saes=["x"])
