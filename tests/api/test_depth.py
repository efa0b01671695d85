"""`sae-atlas analyze depth` and `Atlas.depth_profile` on a tiny model: one stored,
checksummed run with per-layer ID, local ID, trajectory, CKA and lens tables; a layer range
the model lacks and too few tokens for k are clear errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from sae_atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.store.layout import AtlasLayout

TINY = '{"kind": "tiny", "arch": "llama", "n_layers": 4, "seed": 3}'
SMALL = ["--context", "32", "--tokens", "256", "--batch-blocks", "2", "--max-points", "150", "--k", "10",
         "--device", "cpu"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["analyze", "depth", *args])


def test_depth_profile_stores_a_checksummed_run(tmp_path: Path):
    (tmp_path / "atlas").mkdir()
    AtlasLayout(tmp_path / "atlas").update_meta(model=json.loads(TINY))
    atlas = Atlas(tmp_path / "atlas")
    result = atlas.depth_profile(tokens=256, corpus=CorpusSpec(context_size=32), batch_blocks=2, max_points=150,
                                 k=10, n_boot=20)
    main = result.table
    assert main["layer"].to_list() == [0, 1, 2, 3]
    assert (main["mle_low"] <= main["mle"]).all() and (main["mle"] <= main["mle_high"]).all()
    assert main["logit_top1"][-1] == 1.0 and main["logit_kl"][-1] < 1e-5
    assert main["curvature"].null_count() == 2  # a turn needs two steps into the layer
    summary = result.meta["summary"]
    assert summary["id_peak_layer"] in range(4) and summary["logit_lens_first_layer_top1_above_half"] is not None
    assert set(result.meta["tables"]) == {"main", "cka", "tokens", "lid_docs"}
    assert sorted(p.name for p in result.figures) == ["depth.cka.png", "depth.profile.png", "depth.trajectories.png"]
    assert all(p.stat().st_size > 1000 for p in result.figures)
    extremes = summary["extreme_tokens"]["lowest_convergence"]
    assert len(extremes) == 5 and {"block", "position", "token", "convergence_index", "text", "context"} == set(extremes[0])
    assert all(row["context"].split()[-1] == row["text"].strip() for row in extremes)  # the context ends at the token
    assert all(len(info["sha256"]) == 64 for info in result.meta["tables"].values())
    folder = tmp_path / "atlas" / "analyses" / "depth"
    cka = pl.read_parquet(folder / result.meta["tables"]["cka"]["file"])
    M = cka.pivot(on="layer_b", index="layer_a", values="cka").drop("layer_a").to_numpy()
    assert np.allclose(M, M.T) and np.allclose(np.diag(M), 1.0)
    tokens = pl.read_parquet(folder / result.meta["tables"]["tokens"]["file"])
    assert tokens.height == 150 and {"convergence_index", "mean_curvature", "path_length"} <= set(tokens.columns)

    from sae_atlas.api.http import ServerSettings, create_app

    with TestClient(create_app(ServerSettings(root=tmp_path / "atlas"))) as client:  # the generic HTTP read
        body = client.get("/analyses/depth/depth").json()
        assert [row["layer"] for row in body["rows"]] == [0, 1, 2, 3] and body["n_rows"] == 4, body
        assert body["meta"]["summary"]["id_peak_layer"] == summary["id_peak_layer"]
        figure = client.get("/analyses/depth/figures/depth.cka.png")
        assert figure.status_code == 200 and figure.headers["content-type"] == "image/png"


def test_cli_depth_json_and_input_errors(tmp_path: Path):
    atlas = str(tmp_path / "atlas")
    ok = invoke(atlas, "--model", TINY, "--layers", "1-3", "--run", "upper", "--json", *SMALL)
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.output)
    assert out["summary"]["layers"] == [1, 2, 3] and [r["layer"] for r in out["table"]] == [1, 2, 3]
    assert Path(out["json_path"]).is_file()

    lacking = invoke(atlas, "--model", TINY, "--layers", "2-6", *SMALL)
    assert lacking.exit_code == 2 and "has layers 0..3" in lacking.output and "[4, 5, 6]" in lacking.output
    few = invoke(atlas, "--model", TINY, *SMALL[:-4], "--k", "200", "--device", "cpu")
    assert few.exit_code == 2 and "k=200 needs more than 200 tokens" in few.output, few.output
    bad = invoke(atlas, "--model", TINY, "--layers", "one-three", *SMALL)
    assert bad.exit_code == 2 and "--layers must be" in bad.output


def test_cli_depth_families(tmp_path: Path):
    path = tmp_path / "families.json"
    path.write_text(json.dumps({"families": {"animals": ["the cat sat on the mat", "a dog ran to the house",
                                                         "the bird sat in the tree"],
                                             "numbers": ["one two three four", "five six seven eight",
                                                         "nine ten eleven twelve"]}}))
    args = ["--model", TINY, "--k", "5", "--n-permutations", "200", "--device", "cpu"]
    ok = invoke(str(tmp_path / "atlas"), "--families", str(path), "--json", *args)
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.output)
    assert {(t["family_a"], t["family_b"]) for t in out["tests"]} == {("animals", "numbers")}
    assert all(0 < t["p_value"] <= 1 for t in out["tests"]) and out["summary"]["families"] == {"animals": 3, "numbers": 3}
    assert Path(out["json_path"]).name == "depth-families.json"
    path.write_text(json.dumps({"prompts": ["the cat"]}))
    empty = invoke(str(tmp_path / "atlas"), "--families", str(path), *args)
    assert empty.exit_code == 2 and "has no families" in empty.output


def test_depth_run_joins_stored_sae_features(tmp_path: Path):
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.models import tiny_model
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.train_saes import train_saes

    root = tmp_path / "atlas"
    handle = tiny_model(arch="llama", n_layers=4, seed=3)
    cache_activations(handle, root, ["blocks.2.hook_resid_post"], corpus=CorpusSpec(context_size=32),
                      n_tokens=32 * 16, progress=False)
    trained = train_saes(root, ["blocks.2.hook_resid_post"], architecture="topk", d_sae=64, k=4,
                         train_cfg=TrainConfig(total_tokens=256 * 4, batch_size=256, progress=False))
    sae_id = trained["blocks.2.hook_resid_post"]["sae_id"]
    ok = invoke(str(root), "--model", TINY, "--sae", sae_id, "--json", *SMALL)
    assert ok.exit_code == 0, ok.output
    meta = Atlas(root).analysis("depth", "depth").meta
    assert meta["parameters"]["sae_ids"] == [sae_id]
    features = pl.read_parquet(root / "analyses" / "depth" / meta["tables"]["features"]["file"])
    assert features.height > 0 and set(features["sae_id"]) == {sae_id}
    assert (features["n_fires"] >= 5).all() and {"lid_mean", "lid_z", "convergence_index_shift"} <= set(features.columns)
    upper = invoke(str(root), "--model", TINY, "--sae", sae_id, "--layers", "0,1,3", *SMALL)
    assert upper.exit_code == 2 and "reads blocks.2.hook_resid_post" in upper.output, upper.output


def test_families_and_model_b_refuse_torchrun_ranks_and_modes_do_not_mix(tmp_path: Path):
    from sae_atlas.api.operations.depth import DepthParams
    from sae_atlas.api.services.depth import run_depth_operation
    from sae_atlas.errors import InvalidInputError
    from sae_atlas.saes.distributed import DistContext
    from sae_atlas.saes.models import tiny_model

    two_ranks, handle = DistContext(rank=1, world_size=2, local_rank=1), tiny_model(arch="llama", n_layers=4, seed=3)
    for params, rule in [(DepthParams.of(model_b=TINY), "--model-b runs in one process: a model pair's token "
                                                        "subsample draws its seeded keys per batch"),
                         (DepthParams.of(families=tmp_path / "f.json"), "--families runs in one process")]:
        with pytest.raises(InvalidInputError, match=rule):
            run_depth_operation(tmp_path, handle, params, CorpusSpec(context_size=32), ctx=two_ranks)
    both = invoke(str(tmp_path / "atlas"), "--families", "f.json", "--model-b", TINY, *SMALL)
    assert both.exit_code == 2 and "families and model_b are two different runs" in both.output, both.output
    stray = invoke(str(tmp_path / "atlas"), "--layers-b", "1-3", *SMALL)
    assert stray.exit_code == 2 and "layers_b needs model_b" in stray.output, stray.output
    old = invoke("--atlas", str(tmp_path / "atlas"), "--tokens", "0")  # the deprecated option still reaches the check
    assert old.exit_code == 2 and "tokens" in old.output and "deprecated" in old.output, old.output
