"""`sae-atlas emergence` and `Atlas.emergence` on a copy of the small atlas: each member's
scores equal `member_scores` on codes recomputed at the concept and control tokens, the run
is stored with its heat map and served read-only, and bad input is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.emergence import member_scores
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.intervene.concept_codes import concept_feature_acts
from sae_atlas.saes.intervene.concepts import control_concept, weekdays


@pytest.fixture(scope="module")
def atlas(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("emergence") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    return root


def test_cli_scores_each_member_as_recomputed_and_stores_the_run(atlas: Path, small_atlas: dict[str, Any]):
    a, b = small_atlas["sae_ids"]
    out = CliRunner().invoke(app, ["emergence", f"{atlas}:{a}", f"{atlas}:{b}", "--concept", "weekdays", "--concept",
                                   "numbers", "--threshold", "0.8", "--run", "series", "--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["kind"] == "emergence" and body["n_rows"] == 4 and body["figures"] == ["series.png"]
    onsets = body["meta"]["summary"]["onsets"]
    assert [o["concept"] for o in onsets] == ["weekdays", "numbers"]
    handle = Atlas(atlas).model()
    sae = load_atlas_sae(atlas, b)
    acts = [concept_feature_acts(handle, {b: sae}, {b: small_atlas["hooks"][1]}, c)
            for c in (weekdays(), control_concept(weekdays()))]
    direct = member_scores(acts[0].features[b], acts[1].features[b], acts[0].values_N)
    row = next(r for r in body["rows"] if r["concept"] == "weekdays" and r["member"] == b)  # one atlas: SAE ids
    assert row["auroc"] == pytest.approx(direct["auroc"]) and row["latent"] == direct["latent"]
    assert row["probe_accuracy"] == pytest.approx(direct["probe_accuracy"])
    assert row["value_selectivity"] == pytest.approx(direct["value_selectivity"])
    assert row["reached"] == (direct["auroc"] >= 0.8)
    with TestClient(create_app(ServerSettings(root=atlas))) as http:
        assert http.get("/analyses/emergence/series").json()["meta"]["summary"]["threshold"] == 0.8
        assert http.get("/analyses/emergence/figures/series.png").status_code == 200
    table = CliRunner().invoke(app, ["emergence", f"{atlas}:{a}", f"{atlas}:{b}", "--concept", "weekdays"])
    assert table.exit_code == 0 and "onsets" in table.output, table.output


def test_atlas_emergence_takes_sae_ids_and_refuses_bad_input(atlas: Path, small_atlas: dict[str, Any]):
    a, b = small_atlas["sae_ids"]
    animals = {"name": "animals", "kind": "categories", "values": ["cat", "dog", "horse", "cow"],
               "templates": ["the {value} sat on the mat", "a {value} ran to the house", "this is a big {value}"]}
    result = Atlas(atlas).emergence([a, b], [animals], metric="k1_accuracy", threshold=0.6)
    assert result.table["member"].to_list() == [a, b] and result.table["n_concept"].to_list() == [12, 12]
    controls = result.meta["parameters"]["controls"]["animals"]
    assert len(controls) == 4 and not {"cat", "dog", "horse", "cow"} & {w.lower() for w in controls}
    with pytest.raises(InvalidInputError, match="2.."):
        Atlas(atlas).emergence([a], ["weekdays"])
    with pytest.raises(InvalidInputError, match="metric"):
        Atlas(atlas).emergence([a, b], ["weekdays"], metric="f1")
    with pytest.raises(InvalidInputError, match="once"):
        Atlas(atlas).emergence([a, a], ["weekdays"])
