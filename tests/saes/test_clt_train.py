"""Training cross-layer transcoders on a tiny ReLU model's cached MLP inputs and outputs:
a CLT built by hand from the MLPs' own weights reproduces every MLP output, training lowers
the held-out FVU far below the zero-ablation baseline, a killed run resumes to the same
weights, the CLI trains one (`train --transcode --cross-layer`) and bad hooks are refused."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.eval.transcoder import replacement_metrics
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.transcoders.clt import CLTConfig, build_clt
from sae_atlas.saes.transcoders.clt_atlas import train_atlas_clt
from sae_atlas.saes.transcoders.clt_data import CLTReader, clt_metrics
from sae_atlas.saes.transcoders.clt_store import load_atlas_clt
from sae_atlas.saes.transcoders.clt_train import train_clt
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread  # noqa: F401

INS = ["blocks.0.ln2.hook_normalized", "blocks.1.ln2.hook_normalized"]
OUTS = ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]


@pytest.fixture(scope="module")
def handle():
    return tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)


@pytest.fixture(scope="module")
def atlas(tmp_path_factory, handle):
    root = tmp_path_factory.mktemp("clt-atlas")
    cache_activations(handle, root, [*INS, *OUTS], corpus=CorpusSpec(context_size=16), n_tokens=16 * 240,
                      progress=False)
    return root


def _heldout(atlas):
    reader = CLTReader(atlas, INS, OUTS)
    return next(reader.batches(reader.count_tokens("heldout"), split="heldout"))


def exact_clt(handle):
    """Diagonal decoders = each ReLU MLP's W_out, encoders = its W_in, off-diagonal zero, thresholds 0."""
    cfg = CLTConfig(architecture="jumprelu", n_layers=2, d_model=16, d_sae=32)
    clt = build_clt(cfg)
    with torch.no_grad():
        for p in clt.parameters():
            p.zero_()
        clt.log_threshold.fill_(-math.inf)
        for layer in range(2):
            mlp = handle.bridge.blocks[layer].mlp
            clt.W_enc[layer].copy_(mlp.W_in)
            clt.b_enc[layer].copy_(mlp.b_in)
            clt.W_dec[layer][:, 0].copy_(mlp.W_out)
            clt.b_dec[layer].copy_(mlp.b_out)
    return clt


def test_a_clt_of_the_mlps_own_weights_reproduces_them(atlas, handle):
    rows = _heldout(atlas)
    metrics = clt_metrics(exact_clt(handle), rows)
    assert metrics["fvu"] < 1e-10 and max(metrics["fvu_per_layer"]) < 1e-10 and metrics["l0"] > 0


def test_training_lowers_the_fvu_far_below_zero_ablation(atlas, handle):
    train = TrainConfig(total_tokens=256 * 120, batch_size=256, lr=3e-3, progress=False)
    record = train_atlas_clt(atlas, INS, d_sae=64, options={"l0_coefficient": 3e-3}, train_cfg=train)
    assert record["clt_id"] == "clt-ln2.hook_normalized-jumprelu-64"
    rows = _heldout(atlas)
    y = rows[:, 1].double()
    zero_ablation = float(y.pow(2).sum() / (y - y.mean(0)).pow(2).sum())
    clt = load_atlas_clt(atlas, record["clt_id"])
    metrics = clt_metrics(clt, rows)
    print(f"CLT held-out FVU {metrics['fvu']:.4f} (per layer {metrics['fvu_per_layer']}), L0 {metrics['l0']:.1f} "
          f"of {2 * 64}; zero ablation {zero_ablation:.3f}")
    assert metrics["fvu"] < 0.1 and metrics["fvu"] < zero_ablation / 10 and metrics["l0"] < 64
    blocks = [(b.token_ids, torch.zeros_like(b.token_ids, dtype=torch.bool).index_fill_(1, torch.tensor([0]), True))
              for b in iter_blocks(handle.tokenizer, CorpusSpec(context_size=16), max_blocks=8)]
    ce = replacement_metrics(clt, handle.bridge, blocks)  # both MLPs replaced by the CLT at once
    print(f"CE clean {ce['ce_loss_without_sae']:.4f}, CLT {ce['ce_loss_with_sae']:.4f}, zero-ablated MLPs "
          f"{ce['ce_loss_with_ablation']:.4f}; KL {ce['kl_div_with_sae']:.2e} vs {ce['kl_div_with_ablation']:.2e}")
    assert ce["kl_div_with_sae"] < ce["kl_div_with_ablation"] / 10  # (the tiny model's CE barely needs its MLPs)
    assert record["fvu"] == pytest.approx(metrics["fvu"], rel=0.3)  # held-out split of the same cache
    assert AtlasLayout(atlas).read_meta()["clts"][record["clt_id"]]["hooks_out"] == OUTS
    assert train_atlas_clt(atlas, INS, d_sae=64, options={"l0_coefficient": 3e-3}, train_cfg=train) == record
    with pytest.raises(InvalidInputError, match="different configuration"):
        train_atlas_clt(atlas, INS, d_sae=64, train_cfg=train)


@pytest.mark.parametrize("architecture", ["jumprelu", "topk"])
def test_killed_run_resumes_to_the_same_weights(atlas, tmp_path, architecture):
    reader = CLTReader(atlas, INS, OUTS)
    cfg = CLTConfig(architecture=architecture, n_layers=2, d_model=16, d_sae=32, k=4 if architecture == "topk" else None)
    train = TrainConfig(total_tokens=128 * 16, batch_size=128, checkpoint_every_tokens=128 * 4, progress=False)

    def stream(skip):
        return reader.batches(128, seed=0, repeat=True, skip_batches=skip)

    partial = train_clt(cfg, stream, train, out_dir=tmp_path / "clt", stop_after_steps=6)
    assert partial.resumed_from_step is None and (tmp_path / "clt" / "checkpoints").is_dir()
    resumed = train_clt(cfg, stream, train, out_dir=tmp_path / "clt")
    straight = train_clt(cfg, stream, train)
    assert resumed.resumed_from_step == 6 and not (tmp_path / "clt" / "checkpoints").exists()
    for name, value in straight.clt.state_dict().items():
        assert torch.allclose(resumed.clt.state_dict()[name], value, atol=1e-6, rtol=1e-5), name


def test_cli_and_bad_hooks(atlas):
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    args = ["train", str(atlas), "--hook", INS[0], "--hook", INS[1], "--transcode", "--cross-layer",
            "--arch", "topk", "--d-sae", "32", "--k", "4", "--tokens", "2560", "--batch-size", "256", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["clt_id"] == "clt-ln2.hook_normalized-topk-32" and record["hooks_in"] == INS
    refused = CliRunner().invoke(app, ["train", str(atlas), "--hook", INS[0], "--cross-layer"])
    assert refused.exit_code != 0 and "add --transcode" in refused.output
    skip = CliRunner().invoke(app, [*args[:-1], "--skip"])
    assert skip.exit_code != 0 and "do not apply to a cross-layer transcoder" in skip.output
    with pytest.raises(InvalidInputError, match="every block from 0"):
        train_atlas_clt(atlas, INS[1:])
    with pytest.raises(InvalidInputError, match="MLP output itself"):
        train_atlas_clt(atlas, OUTS)
    with pytest.raises(UnknownHookError, match="not cached"):
        train_atlas_clt(atlas, ["blocks.0.hook_resid_mid", "blocks.1.hook_resid_mid"])
