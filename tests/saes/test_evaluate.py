"""SAE evaluation: planted metric values, BOS exclusion, CE/KL splice on a tiny model, eval.json, CLI."""

import json
import math

import pytest
import torch
import typer
from typer.testing import CliRunner

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.downstream import _replacement
from sae_atlas.saes.eval.evaluate import evaluate_atlas_sae, evaluate_sae
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.reconstruction import (
    ReconstructionStats,
    density_histogram,
    reconstruction_stats,
)
from sae_atlas.store.activations import ActivationReader, ActivationWriter
from sae_atlas.store.layout import AtlasLayout

HOOK = "blocks.1.hook_resid_post"


def codes(n: int, d_sae: int, fired: dict[int, int]) -> torch.Tensor:
    """A code `[n, d_sae]` in which latent i fires on the first fired[i] tokens."""
    f = torch.zeros(n, d_sae)
    for i, count in fired.items():
        f[:count, i] = 1.0
    return f


def test_perfect_and_mean_reconstructions():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 6, generator=gen) * torch.tensor([1.0, 2, 3, 4, 5, 6]) + 3
    f = codes(1000, 4, {0: 1000, 1: 50, 2: 200})
    stats = ReconstructionStats(6, 4)
    stats.update(x, x.clone(), f)
    perfect = stats.result()
    assert perfect["explained_variance"] == pytest.approx(1.0) and perfect["fvu"] == pytest.approx(0.0)
    assert perfect["cossim"] == pytest.approx(1.0) and perfect["l2_ratio"] == pytest.approx(1.0)
    assert perfect["relative_reconstruction_bias"] == pytest.approx(1.0)
    assert perfect["l0"] == pytest.approx((1000 + 50 + 200) / 1000)
    assert perfect["dead_fraction"] == 0.25 and perfect["dense_fraction"] == 0.5  # densities 1, .05, .2, 0
    stats = ReconstructionStats(6, 4)
    stats.update(x, x.mean(0, keepdim=True).expand_as(x), f)
    assert stats.result()["explained_variance"] == pytest.approx(0.0, abs=1e-9)


def test_variance_not_mean_square_in_the_denominator():
    # A large mean (norm ~100) and unit noise: predicting the mean explains nothing, although
    # 1 - E||x - x_hat||^2 / E||x||^2 would call it 99.9% explained.
    gen = torch.Generator().manual_seed(1)
    mean = torch.zeros(16)
    mean[:2] = 70.0
    x = mean + torch.randn(4000, 16, generator=gen)
    x_hat = mean.expand_as(x) + 0.5 * (x - mean)  # halve every deviation: FVU = 0.25
    stats = ReconstructionStats(16, 3)
    for chunk, chunk_hat in zip(x.split(512), x_hat.split(512), strict=True):
        stats.update(chunk, chunk_hat, torch.zeros(chunk.shape[0], 3))
    result = stats.result()
    x64 = x.double()
    exact = float((x64 - x_hat.double()).pow(2).sum(-1).mean() / x64.var(0, unbiased=False).sum())
    assert result["fvu"] == pytest.approx(exact, rel=1e-9) and exact == pytest.approx(0.25, rel=1e-2)
    wrong = 1 - float((x - x_hat).pow(2).sum(-1).mean() / x.pow(2).sum(-1).mean())
    assert wrong > 0.999 and result["explained_variance"] == pytest.approx(1 - exact, rel=1e-9)
    assert result["dead_fraction"] == 1.0 and result["density_histogram"]["dead"] == 3


def test_shrinkage_metrics_and_streaming_equals_one_shot():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(300, 5, generator=gen)
    f = (torch.rand(300, 7, generator=gen) > 0.7).float()
    whole, parts = ReconstructionStats(5, 7), ReconstructionStats(5, 7)
    whole.update(x, 0.5 * x, f)
    for a, b in zip(x.split(37), f.split(37), strict=True):
        parts.update(a, 0.5 * a, b)
    one, many = whole.result(), parts.result()
    assert one["relative_reconstruction_bias"] == pytest.approx(0.5)  # E||x/2||^2 / E<x, x/2>
    assert one["l2_ratio"] == pytest.approx(0.5) and one["cossim"] == pytest.approx(1.0)
    for key in ("fvu", "mse", "l0", "l1", "cossim", "relative_reconstruction_bias"):
        assert many[key] == pytest.approx(one[key], rel=1e-9)
    assert torch.equal(whole.density(), parts.density())


def test_sae_metrics_use_variance_not_mean_square_and_restore_training_mode():
    sae = build_sae(SAEConfig("topk", 4, 8, k=1))
    with torch.no_grad():  # an SAE that outputs only b_dec: FVU is 1 when b_dec is the mean
        sae.W_dec.zero_()
        sae.b_dec.fill_(10.0)
    x = 10.0 + torch.randn(4000, 4, generator=torch.Generator().manual_seed(0))
    sae.train()
    stats = reconstruction_stats(sae, [x], batch_size=1000)
    assert sae.training
    assert math.isclose(stats.result()["fvu"], 1.0, rel_tol=0.05)
    assert stats.density().shape == (8,)


def test_density_histogram_bins():
    density = torch.tensor([0.0, 1.0, 0.5, 1e-3, 1e-12])
    hist = density_histogram(density)
    edges, counts = hist["log10_density_edges"], hist["counts"]
    assert hist["dead"] == 1 and sum(counts) == 4
    assert counts[-1] == 2  # densities 1 and 0.5 fall in the last bin [-0.5, 0]
    assert counts[edges.index(-3.0)] == 1 and counts[0] == 1  # 1e-12 is clipped into the first bin


def identity_sae(d: int):
    """A standard SAE with x_hat = relu(x) - relu(-x) = x exactly (latents +e_i and -e_i)."""
    sae = build_sae(SAEConfig(architecture="standard", d_in=d, d_sae=2 * d, hook_name=HOOK))
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def positive_part_sae(d: int):
    """x_hat = relu(x): exact on non-negative activations only."""
    sae = build_sae(SAEConfig(architecture="standard", d_in=d, d_sae=d, hook_name=HOOK))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(d))
        sae.W_dec.copy_(torch.eye(d))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def test_bos_positions_are_excluded(tmp_path):
    gen = torch.Generator().manual_seed(3)
    n, t, d = 20, 8, 6
    acts = torch.rand(n, t, d, generator=gen) + 0.1
    acts[:, 0] = -100.0  # a huge BOS activation the SAE cannot reconstruct
    tokens = torch.randint(3, 10, (n, t), generator=gen)
    tokens[:, 0] = 1
    writer = ActivationWriter(tmp_path, HOOK, d=d, model="planted", context_size=t,
                              bos_token_id=1, prepend_bos=True, shard_blocks=4)
    writer.append(acts, tokens, torch.arange(n))
    writer.finish()
    reader = ActivationReader(tmp_path, HOOK)
    sae = positive_part_sae(d)
    metrics = evaluate_sae(sae, reader, n_tokens=10_000)
    assert metrics["n_tokens"] == 2 * (t - 1)  # two held-out blocks, BOS dropped
    assert metrics["explained_variance"] == pytest.approx(1.0)
    with_bos = ReconstructionStats(d, d)
    held = torch.cat([b.acts.reshape(-1, d) for b in reader.blocks(split="heldout")])
    out = sae(held)
    with_bos.update(held, out.x_hat, out.feature_acts)
    assert with_bos.result()["explained_variance"] < 0.2
    batches = reader.batches(4, split="heldout", exclude_bos=True, buffer_tokens=64)
    assert evaluate_sae(sae, batches)["explained_variance"] == pytest.approx(1.0)
    assert evaluate_sae(sae, reader, n_tokens=5)["n_tokens"] == 5
    with pytest.raises(InvalidInputError, match="d_in=2 but hook"):
        evaluate_sae(identity_sae(2), reader)


def test_replacement_keeps_bos_positions():
    act = torch.arange(12.0).reshape(1, 3, 4)
    keep = torch.tensor([[True, False, False]])
    out = _replacement(torch.zeros_like, keep)(act, None)
    assert torch.equal(out[0, 0], act[0, 0]) and not out[0, 1:].any()


@pytest.fixture(scope="module")
def tiny_atlas(tmp_path_factory):
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import tiny_model

    root = tmp_path_factory.mktemp("atlas")
    handle = tiny_model(n_layers=2, d_model=32, seed=3)
    cache_activations(handle, root, [HOOK], corpus=CorpusSpec(context_size=16), n_tokens=16 * 20,
                      batch_blocks=10, shard_blocks=10, progress=False)
    return root, handle


def test_ce_recovered_identity_one_zero_zero(tiny_atlas):
    root, handle = tiny_atlas
    reader = ActivationReader(root, HOOK)
    perfect = evaluate_sae(identity_sae(32), reader, model_handle=handle, ce_blocks=2)
    assert abs(perfect["ce_loss_with_ablation"] - perfect["ce_loss_without_sae"]) > 0.01
    assert perfect["ce_loss_score"] == pytest.approx(1.0, abs=1e-6)
    assert perfect["kl_div_score"] == pytest.approx(1.0, abs=1e-6)
    assert perfect["kl_div_with_sae"] == pytest.approx(0.0, abs=1e-6)
    zero = build_sae(SAEConfig(architecture="standard", d_in=32, d_sae=64))
    with torch.no_grad():
        for param in zero.parameters():
            param.zero_()
    ablated = evaluate_sae(zero, reader, model_handle=handle, ce_blocks=2)
    assert ablated["ce_loss_score"] == pytest.approx(0.0, abs=1e-6)
    assert ablated["kl_div_score"] == pytest.approx(0.0, abs=1e-6)
    blocks = list(reader.blocks(split="heldout"))
    is_bos = torch.cat([b.is_bos for b in blocks])[:2]
    expected = int((~is_bos[:, :-1] & ~is_bos[:, 1:]).sum())
    assert perfect["n_ce_positions"] == expected and perfect["n_ce_blocks"] == 2
    assert expected <= 2 * 14  # position 0 (BOS) never counts


def test_evaluate_atlas_sae_writes_eval_json_and_cli(tiny_atlas, tmp_path):
    root, handle = tiny_atlas
    save_saelens(identity_sae(32), AtlasLayout(root).sae_dir("ident"))
    record = evaluate_atlas_sae(root, "ident", model_handle=handle, ce_blocks=1, n_tokens=20)
    saved = json.loads((AtlasLayout(root).sae_dir("ident") / "eval.json").read_text())
    assert saved["metrics"]["ce_loss_score"] == pytest.approx(1.0, abs=1e-6)
    assert saved["parameters"]["hook"] == HOOK and saved["parameters"]["n_tokens_requested"] == 20
    assert "torch" in saved["created_with"] and record["metrics"]["n_tokens"] == 20

    from sae_atlas.api.commands import eval as eval_command

    app = typer.Typer()
    eval_command.register(app)
    app.command("noop")(lambda: None)  # keep `eval` a named sub-command
    runner = CliRunner()
    result = runner.invoke(app, ["eval", str(root), "--no-model", "--tokens", "50", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ident"]["metrics"]["explained_variance"] == pytest.approx(1.0)
    table = runner.invoke(app, ["eval", str(root), "--no-model", "--tokens", "50"])
    assert table.exit_code == 0 and "SAE evaluation" in table.output
    missing = runner.invoke(app, ["eval", str(root), "--sae", "nope", "--no-model"])
    assert missing.exit_code == 2 and "unknown SAE id" in missing.output
