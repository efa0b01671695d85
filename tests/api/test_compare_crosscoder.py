"""`sae-atlas train-crosscoder` between two tiny models streamed at the same tokens."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.saes.compare.crosscoder import read_crosscoder_sides
from sae_atlas.store.layout import AtlasLayout
from tests.saes.compare_fixtures import one_thread  # noqa: F401

MODEL = {"kind": "tiny", "n_layers": 2, "d_model": 32}


def test_train_crosscoder_stores_the_weights_and_the_relative_norms(tmp_path):
    root = tmp_path / "atlas"
    AtlasLayout(root).update_meta(model=MODEL)
    other = json.dumps({**MODEL, "d_model": 48, "seed": 1})
    out = CliRunner().invoke(app, ["train-crosscoder", str(root), "--hook-a", "blocks.1.hook_resid_post",
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
    out = CliRunner().invoke(app, ["train-crosscoder", str(root), "--hook-a", "blocks.1.hook_resid_post",
                                   "--hook-b", "blocks.1.hook_resid_post"])
    assert out.exit_code == 2 and "name two hooks or a second model" in out.output


def test_latent_scaling_adds_its_columns_to_the_crosscoder_table_and_reruns_alike(tmp_path):
    root = tmp_path / "atlas"
    AtlasLayout(root).update_meta(model=MODEL)
    other = json.dumps({**MODEL, "seed": 1})  # the same width: one space for both sides
    out = CliRunner().invoke(app, ["train-crosscoder", str(root), "--hook-a", "blocks.1.hook_resid_post",
                                   "--hook-b", "blocks.1.hook_resid_post", "--model-b", other, "--d-sae", "16",
                                   "--k", "2", "--tokens", "1024", "--batch-size", "256", "--context", "32",
                                   "--id", "pair", "--latent-scaling-tokens", "512", "--json"])
    assert out.exit_code == 0, out.output
    table = Atlas(root).analysis("crosscoder", "pair").table
    fired = table.filter(table["scaling_active_tokens"] > 0)
    assert fired.height > 8 and fired["beta_error_b"].is_finite().all() and fired["nu_recon"].is_finite().all()
    assert table.filter(table["scaling_active_tokens"] == 0)["nu_error"].is_nan().all()
    page = Atlas(root).crosscoder_latents("pair", limit=16)  # what the explorer's Compare page reads
    assert {"beta_error_a", "beta_recon_b", "nu_error", "nu_recon", "scaling_active_tokens"} <= set(page.rows[0]["scaling"])
    json.dumps(page.to_dict())  # NaN (latents that never fired) goes out as null
    again = CliRunner().invoke(app, ["latent-scaling", str(root), "--id", "pair", "--tokens", "512"])
    assert again.exit_code == 0, again.output
    rerun = Atlas(root).latent_scaling("pair", tokens=512).table
    assert rerun.columns == table.columns
    assert rerun.select("nu_error", "nu_recon").equals(table.select("nu_error", "nu_recon"))


def test_latent_scaling_of_two_widths_is_refused_before_training(tmp_path):
    root = tmp_path / "atlas"
    AtlasLayout(root).update_meta(model=MODEL)
    out = CliRunner().invoke(app, ["train-crosscoder", str(root), "--hook-a", "blocks.1.hook_resid_post",
                                   "--hook-b", "blocks.1.hook_resid_post", "--model-b",
                                   json.dumps({**MODEL, "d_model": 48}), "--latent-scaling-tokens", "64"])
    assert out.exit_code == 2 and "one space" in out.output
    assert not (root / "crosscoders").exists()
