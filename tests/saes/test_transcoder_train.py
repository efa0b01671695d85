"""Training per-layer transcoders on a tiny model's cached (MLP input, MLP output) pairs:
both layers in one call reach a low FVU of the MLP output, the paired rows are the same
tokens, a killed run resumes to the same weights, and bad pairings are refused."""

from __future__ import annotations

import json

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats import load_saelens
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.paired_rows import PairedReader
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.saes.train.trainer import train_sae
from sae_atlas.saes.transcoders.clt_atlas import train_atlas_clt
from sae_atlas.saes.transcoders.sites import mlp_output_hook
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread  # noqa: F401

INS = ["blocks.0.ln2.hook_normalized", "blocks.1.ln2.hook_normalized"]
OUTS = [mlp_output_hook(h) for h in INS]


@pytest.fixture(scope="module")
def handle():
    return tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)


@pytest.fixture(scope="module")
def atlas(tmp_path_factory, handle):
    root = tmp_path_factory.mktemp("tc-atlas")
    cache_activations(handle, root, [*INS, *OUTS], corpus=CorpusSpec(context_size=16), n_tokens=16 * 240,
                      progress=False)
    return root


def test_paired_rows_are_the_same_tokens(atlas, handle):
    """Each paired row's output part is the MLP applied to its input part (same token)."""
    mlp = handle.bridge.blocks[1].mlp
    rows = next(PairedReader(atlas, INS[1], OUTS[1]).batches(128, seed=4))
    x, y = rows[:, :16], rows[:, 16:]
    assert torch.allclose((x @ mlp.W_in + mlp.b_in).relu() @ mlp.W_out + mlp.b_out, y, atol=1e-5)


def test_transcoders_at_two_layers_reach_low_fvu(atlas):
    cfg = TrainConfig(total_tokens=30_000, batch_size=256, progress=False)
    results = train_saes(atlas, INS, architecture="topk", d_sae=64, k=16, train_cfg=cfg,
                         hook_out=dict(zip(INS, OUTS, strict=True)), sae_options={"skip": True})
    records = AtlasLayout(atlas).read_meta()["saes"]
    for hook_in, hook_out in zip(INS, OUTS, strict=True):
        record = results[hook_in]
        assert record["sae_id"] == f"{hook_in}-to-{hook_out}-topk-skip-64"
        assert record["fvu"] < 0.1, record  # held-out FVU of the MLP output
        assert records[record["sae_id"]]["hook_out"] == hook_out
        sae = load_saelens(AtlasLayout(atlas).sae_dir(record["sae_id"]))
        assert sae.cfg.hook_name == hook_in and sae.cfg.hook_name_out == hook_out and sae.cfg.skip
        training = json.loads((AtlasLayout(atlas).sae_dir(record["sae_id"]) / "training.json").read_text())
        assert training["final_metrics"]["output_scale"] != training["input_scale"]  # its own target scale
        # the saved (folded) transcoder predicts raw MLP outputs from raw inputs
        rows = next(PairedReader(atlas, hook_in, hook_out).batches(256, split="heldout"))
        error = (sae(rows[:, :16]).x_hat.detach() - rows[:, 16:]).pow(2).sum(-1).mean()
        assert float(error / (rows[:, 16:] - rows[:, 16:].mean(0)).pow(2).sum(-1).mean()) < 0.1


def test_killed_run_resumes_to_the_same_weights(atlas, tmp_path):
    reader = PairedReader(atlas, INS[0], OUTS[0])
    sae_cfg = SAEConfig(architecture="jumprelu", d_in=16, d_sae=48, hook_name=INS[0], hook_name_out=OUTS[0],
                        apply_b_dec_to_input=False, skip=True, l0_coefficient=1e-3)
    cfg = TrainConfig(total_tokens=256 * 24, batch_size=256, checkpoint_every_tokens=256 * 8, progress=False)

    def stream(skip: int):
        return reader.batches(256, seed=0, repeat=True, skip_batches=skip)

    partial = train_sae(sae_cfg, stream, cfg, out_dir=tmp_path / "tc", stop_after_steps=10)
    assert partial.resumed_from_step is None
    resumed = train_sae(sae_cfg, stream, cfg, out_dir=tmp_path / "tc")
    straight = train_sae(sae_cfg, stream, cfg)
    assert resumed.resumed_from_step == 10
    for name, value in straight.sae.state_dict().items():
        assert torch.allclose(resumed.sae.state_dict()[name], value, atol=1e-6, rtol=1e-5), name
    assert straight.final_metrics["fvu"] < 0.5


def test_bad_pairings_are_refused(atlas, handle, tmp_path):
    with pytest.raises(InvalidInputError, match="not trained"):
        train_saes(atlas, INS[:1], hook_out={INS[1]: OUTS[1]})
    with pytest.raises(InvalidInputError, match="MLP output itself"):
        mlp_output_hook(OUTS[0])
    # another cache run (another corpus order) of the output hook holds other tokens: no pairing
    other = tmp_path / "other"
    cache_activations(handle, other, [INS[0]], corpus=CorpusSpec(context_size=16), n_tokens=16 * 40, progress=False)
    cache_activations(handle, other, [OUTS[0]], corpus=CorpusSpec(context_size=16, seed=1), n_tokens=16 * 40,
                      progress=False)
    with pytest.raises(InvalidInputError, match="same tokens"):
        PairedReader(other, INS[0], OUTS[0])


def test_cli_train_transcode(atlas):
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    args = ["train", str(atlas), "--hook", INS[1], "--transcode", "--skip", "--arch", "topk",
            "--d-sae", "32", "--k", "8", "--tokens", "2560", "--batch-size", "256", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)[INS[1]]
    assert (record["hook"], record["hook_out"], record["skip"]) == (INS[1], OUTS[1], True)
    refused = CliRunner().invoke(app, ["train", str(atlas), "--transcode"])
    assert refused.exit_code != 0 and "--transcode needs the MLP inputs" in refused.output


@pytest.mark.parametrize(("hook", "why"), [
    ("blocks.0.hook_resid_post", "lies after the MLP of block 0 and already holds its output"),
    ("blocks.0.hook_mlp_out", "is the MLP output itself"),
    ("blocks.0.hook_resid_pre", "is not the input of block 0's MLP"),
    ("hook_embed", "is not inside a block"),
])
def test_only_an_mlp_input_is_a_transcoder_input(hook, why):
    """One rule (`saes.transcoders.sites`) for training and graphs: a hook after the MLP
    already holds the output a transcoder would predict, so it is refused naming the inputs."""
    with pytest.raises(InvalidInputError, match=why) as refused:
        mlp_output_hook(hook)
    assert "ln2.hook_normalized or blocks." in str(refused.value) and "hook_resid_mid" in str(refused.value)
    assert [mlp_output_hook(h) for h in ("blocks.2.ln2.hook_normalized", "blocks.2.hook_resid_mid",
                                         "blocks.2.mlp.hook_in")] == ["blocks.2.hook_mlp_out"] * 3


def test_cli_train_transcode_refuses_a_hook_after_the_mlp_before_training(atlas):
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    before = sorted(p.name for p in (atlas / "saes").iterdir()) if (atlas / "saes").is_dir() else []
    result = CliRunner().invoke(app, ["train", str(atlas), "--hook", "blocks.0.hook_resid_post",
                                      "--transcode", "--arch", "topk", "--d-sae", "64", "--k", "4", "--tokens", "8192"])
    assert result.exit_code != 0
    assert "'blocks.0.hook_resid_post' lies after the MLP of block 0" in result.output
    assert "blocks.0.ln2.hook_normalized or blocks.0.hook_resid_mid" in result.output
    after = sorted(p.name for p in (atlas / "saes").iterdir()) if (atlas / "saes").is_dir() else []
    assert after == before  # nothing trained, nothing registered
    with pytest.raises(InvalidInputError, match="lies after the MLP of block 0"):
        train_atlas_clt(atlas, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"])
