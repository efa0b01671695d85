"""`sae-atlas train-crosscoder` between two tiny models streamed at the same tokens."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from api.atlas import Atlas
from api.cli import app
from saes.compare.crosscoder import read_crosscoder_sides
from store.layout import AtlasLayout
from tests.saes.compare_fixtures import one_thread  # noqa: F401

MODEL = {"kind": "tiny", "n_layers": 2, "d_model": 32}


def test_train_crosscoder_stores_the_weights_and_the_relative_norms(tmp_path):
    root = tmp_path / "atlas"
    AtlasLayout(root).update_meta(model=MODEL)
    other = json.dumps({**MODEL, "d_model": 48, "seed": 1})
    out = CliRunner().invoke(app, ["train-crosscoder", "--atlas", str(root), "--hook-a", "blocks.1.hook_resid_post",
                                   "--hook-b", "blocks.1.hook_resid_post", "--model-b", other, "--d-sae", "16",
                                   "--k", "2", "--tokens", "2048", "--pass-tokens", "1024", "--batch-size", "256",
                                   "--context", "32", "--id", "pair", "--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["run"] == "pair" and body["n_rows"] == 16
    s = body["meta"]["summary"]
    assert s["a_only"] + s["shared"] + s["b_only"] == 16
    table = Atlas(root).analysis("crosscoder", "pair").table
    assert table["relative_norm"].is_between(0, 1).all()
    sides = read_crosscoder_sides(root / "crosscoders" / "pair")
    assert sides["d_a"] == 32 and sides["d_b"] == 48 and sides["sides"]["hook_b"] == "blocks.1.hook_resid_post"


def test_one_hook_of_one_model_twice_is_refused(tmp_path):
    root = tmp_path / "atlas"
    AtlasLayout(root).update_meta(model=MODEL)
    out = CliRunner().invoke(app, ["train-crosscoder", "--atlas", str(root), "--hook-a", "blocks.1.hook_resid_post",
                                   "--hook-b", "blocks.1.hook_resid_post"])
    assert out.exit_code == 2 and "name two hooks or a second model" in out.output
