"""`sae-atlas compare-circle`, `Atlas.compare_circle` and the stored run on a copy of the
small atlas: A's own row equals the circle probe fitted directly on the concept tokens, B
may be an SAE of an atlas or a model's hook, the run is served read-only over HTTP, and
references that hold no circle are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from sae_atlas.api.analyses.circular import run_circle_analysis, write_concept_run
from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.circle import fit_circle_probe
from sae_atlas.saes.intervene.concepts import (
    collect_concept_activations,
    tokenize_prompts,
    weekdays,
)

TINY_B = json.dumps({"kind": "tiny", "n_layers": 2, "d_model": 32, "seed": 7})


@pytest.fixture(scope="module")
def atlas(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the small atlas with a stored weekday circle run (`circular/weekdays`)."""
    root = tmp_path_factory.mktemp("circle") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    handle = Atlas(root).model()
    write_concept_run(root, "weekdays", run_circle_analysis(handle, weekdays(), [0, 1]), model=handle.name)
    return root


def test_a_s_row_is_the_circle_probe_on_the_concept_tokens(atlas: Path, small_atlas: dict[str, Any]):
    a, b = small_atlas["sae_ids"]
    result = Atlas(atlas).compare_circle("circular/weekdays", atlas, sae=a, other_sae=b, n_null=30, n_random=3)
    assert result.kind == "circle_transfer" and result.run == f"weekdays-{a}--atlas.{b}"
    rows = {f"{r['side']}_{r['space']}": r for r in result.table.iter_rows(named=True)}
    assert {"A_residual", "A_span", "B_residual", "B_span", "B_a_probe", "B_a_span"} == set(rows)
    handle = Atlas(atlas).model()
    batch = tokenize_prompts(handle.tokenizer, weekdays().prompts(), bos_token_id=handle.bos_token_id)
    X = collect_concept_activations(handle, batch, [small_atlas["hooks"][0]])[small_atlas["hooks"][0]].numpy()
    direct = fit_circle_probe(X.astype(np.float64), batch.values.numpy(), 7, n_null=30)
    assert rows["A_residual"]["r2"] == pytest.approx(direct.r2, abs=1e-6)
    assert rows["A_residual"]["p_value"] == pytest.approx(direct.r2_p_value)
    assert rows["A_residual"]["order_matches_a"] and set(rows["B_residual"]["order"]) == set(weekdays().values)
    stored = Atlas(atlas).analysis("circle_transfer", result.run)
    assert stored.meta["parameters"]["b"]["sae"] == b and "found_in_b" in stored.meta["summary"]
    with TestClient(create_app(ServerSettings(root=atlas))) as http:
        got = http.get(f"/analyses/circle_transfer/{result.run}")
        assert got.status_code == 200 and got.json()["n_rows"] == 6
        assert http.get(f"/analyses/circle_transfer/figures/{result.run}.png").status_code == 200


def test_cli_looks_in_a_model_s_hook(atlas: Path, small_atlas: dict[str, Any]):
    a = small_atlas["sae_ids"][0]
    out = CliRunner().invoke(app, ["compare-circle", f"{atlas}:{a}", "--circle", "circular/weekdays", "--model-b",
                                   TINY_B, "--n-null", "20", "--n-random", "2", "--run", "tiny-b", "--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    spaces = [(r["side"], r["space"]) for r in body["rows"]]
    assert spaces == [("A", "residual"), ("A", "span"), ("B", "residual"), ("B", "a_probe"), ("B", "a_span")]
    assert body["meta"]["parameters"]["b"]["hook"] == small_atlas["hooks"][0]
    table = CliRunner().invoke(app, ["compare-circle", f"{atlas}:{a}", "--circle", "circular/weekdays", "--model-b",
                                     TINY_B, "--n-null", "5", "--n-random", "0"])
    assert table.exit_code == 0 and "found in B" in table.output, table.output


def test_references_without_a_circle_are_refused(atlas: Path, small_atlas: dict[str, Any]):
    a, b = small_atlas["sae_ids"]
    at = Atlas(atlas)
    with pytest.raises(InvalidInputError, match="KIND/RUN"):
        at.compare_circle("lobes/x", atlas, sae=a, other_sae=b)
    with pytest.raises(InvalidInputError, match="not both"):
        at.compare_circle("circular/weekdays", atlas, sae=a, other_sae=b, model_b=TINY_B)
    vocab = at.model().tokenizer.get_vocab()
    at.concept_search({"name": "c", "kind": "categories", "values": [w for w in ("red", "blue", "green") if w in vocab],
                       "templates": ["the car is {value}", "a {value} house"]}, saes=[a], save="cats")
    with pytest.raises(InvalidInputError, match="ordered"):
        at.compare_circle("concept_search/cats", atlas, sae=a, other_sae=b)


def test_a_concept_search_run_passes_its_search_options(atlas: Path, small_atlas: dict[str, Any]):
    a, b = small_atlas["sae_ids"]
    at = Atlas(atlas)
    at.concept_search("weekdays", saes=[a], min_selectivity=0.3, max_features=4, save="wk")
    result = at.compare_circle("concept_search/wk", atlas, sae=a, other_sae=b, n_null=10, n_random=2, run="wk-b")
    search = result.meta["parameters"]["search"]
    assert search["min_selectivity"] == 0.3 and search["max_features"] == 4
    span = result.table.filter((result.table["side"] == "A") & (result.table["space"] == "span"))
    assert len(span["latents"].to_list()[0] or []) <= 4
