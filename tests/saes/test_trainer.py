"""Trainer: every architecture recovers a planted dictionary; scaling fold; config errors."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.architectures import ARCHITECTURES, build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import (
    LONG_RUN_STEPS,
    MAX_SHORT_RUN_MULTIPLIER,
    TrainConfig,
    default_lr,
)
from sae_atlas.saes.train.geometric_median import geometric_median
from sae_atlas.saes.train.scaling import fold_input_scale
from sae_atlas.saes.train.schedule import lr_factor
from sae_atlas.saes.train.trainer import TrainResult, train_sae
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import (  # noqa: F401
    one_thread,
    planted_atoms,
    planted_batches,
    recovery,
    write_planted_atlas,
)

D_IN, N_ATOMS, D_SAE, ACTIVE, BATCH, STEPS = 32, 128, 256, 3, 256, 400
ARCH_OPTIONS = {
    "standard": {"l1_coefficient": 1.0, "l1_warmup_steps": 50},
    "topk": {"k": ACTIVE},
    "batchtopk": {"k": ACTIVE},
    "jumprelu": {"l0_coefficient": 1.0, "jumprelu_init_threshold": 0.5},
    "matryoshka": {"k": ACTIVE},
}


@pytest.fixture(scope="module")
def atoms() -> torch.Tensor:
    return planted_atoms(D_IN, N_ATOMS)


@pytest.fixture(scope="module")
def trained(atoms: torch.Tensor) -> dict[str, TrainResult]:
    """One short run per architecture on the same planted stream (scaled raw inputs x 7)."""
    data = [7.0 * b for b in planted_batches(atoms, BATCH, STEPS, active=ACTIVE)]
    heldout = [7.0 * b for b in planted_batches(atoms, BATCH, 8, active=ACTIVE, seed=99)]
    cfg = TrainConfig(total_tokens=BATCH * STEPS, batch_size=BATCH, lr=2e-2, progress=False)
    return {
        arch: train_sae(SAEConfig(arch, D_IN, D_SAE, **ARCH_OPTIONS[arch]), data, cfg, eval_batches=heldout)
        for arch in ARCHITECTURES
    }


def test_initial_decoder_is_not_the_planted_dictionary(atoms: torch.Tensor) -> None:
    """Recovery must be earned: same-seeded data and initial weights draw different rows."""
    for seed in (0, 1):
        sae = build_sae(SAEConfig("topk", D_IN, D_SAE, k=ACTIVE, seed=seed))
        assert recovery(sae.W_dec, planted_atoms(D_IN, N_ATOMS, seed=seed)) < 0.7


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_recovers_the_planted_dictionary(
    arch: str, trained: dict[str, TrainResult], atoms: torch.Tensor
) -> None:
    result = trained[arch]
    # measured at 400 steps: 0.90 (jumprelu, its step-function threshold learns slowest) to 0.99
    assert recovery(result.sae.W_dec, atoms) >= (0.85 if arch == "jumprelu" else 0.9)
    assert result.heldout_metrics["fvu"] < 0.3
    assert torch.allclose(result.sae.W_dec.norm(dim=-1), torch.ones(D_SAE), atol=1e-5)
    assert 1.0 <= result.heldout_metrics["l0"] <= 20.0
    assert [h["step"] for h in result.history][-1] == STEPS


def test_topk_and_batchtopk_inference_sparsity(trained: dict[str, TrainResult]) -> None:
    assert trained["topk"].heldout_metrics["l0"] <= ACTIVE
    for arch in ("batchtopk", "matryoshka"):  # the learned threshold gives L0 close to k
        assert abs(trained[arch].heldout_metrics["l0"] - ACTIVE) < 0.25 * ACTIVE


def test_inputs_are_normalised_and_folded(trained: dict[str, TrainResult], atoms: torch.Tensor) -> None:
    result = trained["topk"]
    raw = torch.cat(list(planted_batches(atoms, BATCH, 8, active=ACTIVE)))[: BATCH * 8] * 7.0
    scale = result.input_scale
    assert math.isclose(float((raw * scale).pow(2).sum(-1).mean()), D_IN, rel_tol=0.05)
    assert result.sae.training is False


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_folded_sae_on_raw_inputs_equals_scaled_unfolded(arch: str) -> None:
    torch.manual_seed(0)
    sae = build_sae(SAEConfig(arch, 16, 64, **({"k": 4} if "k" in ARCH_OPTIONS[arch] else {})))
    with torch.no_grad():
        sae.b_dec.normal_()
        sae.b_enc.normal_(0, 0.3)
        if arch == "jumprelu":
            sae.log_threshold.uniform_(-2, 0)
        if arch in ("batchtopk", "matryoshka"):
            sae.threshold.fill_(0.4)
    sae.eval()
    scale = 0.137
    folded = fold_input_scale(sae, scale)
    x = torch.randn(50, 16) * 9
    with torch.no_grad():
        expected = sae(scale * x).x_hat / scale
        got = folded(x).x_hat
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(folded.W_dec, sae.W_dec)


def test_geometric_median_is_robust_and_optimal() -> None:
    pts = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    assert torch.allclose(geometric_median(pts), torch.tensor([1.0, 0.0]), atol=1e-4)
    gen = torch.Generator().manual_seed(0)
    cloud = torch.cat([torch.randn(200, 5, generator=gen), torch.full((20, 5), 100.0)])
    gm = geometric_median(cloud)
    assert gm.norm() < 1.0 < cloud.mean(0).norm()  # the outliers pull the mean, not the median
    cost = lambda p: float((cloud - p).norm(dim=1).sum())  # noqa: E731
    for _ in range(5):
        assert cost(gm) <= cost(gm + 0.05 * torch.randn(5, generator=gen))


def test_lr_schedule_and_default_lr() -> None:
    assert math.isclose(default_lr(2**14), 2e-4) and math.isclose(default_lr(2**16), 1e-4)
    assert math.isclose(default_lr(2**14, 10**6, "gao2024"), 2e-4)
    short, long = default_lr(2**14, 256), default_lr(2**14, LONG_RUN_STEPS)
    assert math.isclose(short, 2e-4 * MAX_SHORT_RUN_MULTIPLIER) and math.isclose(long, 2e-4)
    assert short >= default_lr(2**14, 4096) >= long == default_lr(2**14, 10 * LONG_RUN_STEPS)
    factors = [lr_factor(s, 100, 10, 0.2) for s in range(100)]
    assert factors[0] == 0.1 and factors[9] == 1.0 and factors[50] == 1.0
    assert factors[80] == 1.0 and math.isclose(factors[90], 0.5) and factors[99] == 0.05


def test_resolved_defaults_scale_with_the_run() -> None:
    cfg = TrainConfig(total_tokens=262_144, batch_size=4096).resolve(d_in=576, d_sae=4608)
    assert cfg.lr_warmup_steps == 3 and cfg.k_aux == 288
    assert cfg.lr == default_lr(4608, 64) > default_lr(4608, 64, "gao2024")
    assert TrainConfig(total_tokens=262_144, lr_rule="gao2024").resolve(576, 4608).lr == default_lr(4608)
    assert cfg.dead_window_tokens == 26_214 and cfg.checkpoint_every_tokens == 26_214


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total_tokens": 0}, "total_tokens"),
        ({"total_tokens": 10, "batch_size": 64}, "at least one batch"),
        ({"lr": -1.0}, "lr must be"),
        ({"b_dec_init": "median"}, "b_dec_init"),
        ({"lr_rule": "fast"}, "lr_rule"),
        ({"lr_decay_fraction": 1.5}, "lr_decay_fraction"),
        ({"k_aux": -3}, "k_aux"),
    ],
)
def test_bad_train_config_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        TrainConfig(**kwargs)


def test_unknown_config_keys_and_bad_batches_are_rejected(atoms: torch.Tensor) -> None:
    with pytest.raises(InvalidInputError, match="unknown training config keys"):
        TrainConfig.from_dict({"total_tokenz": 5})
    cfg = TrainConfig(total_tokens=64 * 4, batch_size=64, progress=False)
    sae_cfg = SAEConfig("topk", D_IN, 64, k=2)
    with pytest.raises(InvalidInputError, match="ran out after 2 batches"):
        train_sae(sae_cfg, list(planted_batches(atoms, 64, 2)), cfg)
    with pytest.raises(InvalidInputError, match="expected batches of shape"):
        train_sae(sae_cfg, [torch.randn(64, D_IN + 1)] * 4, cfg)


def test_dead_latents_get_auxk_after_the_window(atoms: torch.Tensor) -> None:
    data = list(itertools.islice(planted_batches(atoms, 128, 40), 40))
    cfg = TrainConfig(total_tokens=128 * 40, batch_size=128, dead_window_tokens=128 * 5,
                      lr=3e-3, progress=False, log_every_steps=5)
    result = train_sae(SAEConfig("topk", D_IN, 512, k=2), data, cfg)
    assert "auxk" not in result.history[0] and "auxk" in result.history[-1]
    assert result.history[-1]["dead_fraction"] > 0


def test_cli_trains_every_cached_hook_and_records_the_saes(tmp_path: Path) -> None:
    pytest.importorskip("sae_atlas.saes.formats.saelens")
    import typer
    from typer.testing import CliRunner

    from sae_atlas.api.commands.train import register

    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    write_planted_atlas(tmp_path, hooks)
    config = tmp_path / "train.toml"
    config.write_text('arch = "batchtopk"\nk = 3\nbatch-size = 64\nlr = 0.003\nscale_batches = 2\n')
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # keep `train` a subcommand
    runner = CliRunner()
    args = ["train", str(tmp_path), "--config", str(config), "--d-sae", "64",
            "--tokens", "640", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    results = json.loads(res.output)
    assert sorted(results) == hooks
    ids = {results[h]["sae_id"] for h in hooks}
    assert ids == {f"{h}-batchtopk-64" for h in hooks}
    meta = AtlasLayout(tmp_path).read_meta()
    assert set(meta["saes"]) == ids and meta["saes"][f"{hooks[0]}-batchtopk-64"]["k"] == 3
    record = json.loads((AtlasLayout(tmp_path).sae_dir(f"{hooks[1]}-batchtopk-64") / "training.json").read_text())
    assert record["train_config"]["scale_batches"] == 2 and record["heldout_metrics"]["fvu"] < 1.0
    assert "torch" in record["created_with"]
    again = runner.invoke(app, args)  # finished SAEs with the same config are not retrained
    assert again.exit_code == 0 and json.loads(again.output) == results

    config.write_text("learning_rate = 1\n")
    bad = runner.invoke(app, ["train", str(tmp_path), "--config", str(config)])
    assert bad.exit_code == 2 and "unknown key 'learning_rate'" in bad.output
    bad = runner.invoke(app, ["train", str(tmp_path), "--hook", "blocks.9.hook_resid_post"])
    assert bad.exit_code == 2 and "not cached" in bad.output


def test_existing_sae_with_other_config_is_not_silently_replaced(tmp_path: Path) -> None:
    pytest.importorskip("sae_atlas.saes.formats.saelens")
    from sae_atlas.saes.train.train_saes import train_saes

    hook = "blocks.0.hook_resid_post"
    write_planted_atlas(tmp_path, [hook], n_blocks=20)
    cfg = TrainConfig(total_tokens=64 * 4, batch_size=64, progress=False, scale_batches=2)
    first = train_saes(tmp_path, architecture="topk", d_sae=64, k=3, train_cfg=cfg)
    with pytest.raises(InvalidInputError, match=r"different configuration \(differs in sae_config.k\)"):
        train_saes(tmp_path, architecture="topk", d_sae=64, k=5, train_cfg=cfg)
    longer = TrainConfig(total_tokens=64 * 8, batch_size=64, progress=False, scale_batches=2)
    with pytest.raises(InvalidInputError, match=r"differs in train_config.total_tokens\)"):
        train_saes(tmp_path, architecture="topk", d_sae=64, k=3, train_cfg=longer)
    again = train_saes(tmp_path, architecture="topk", d_sae=64, k=5, train_cfg=cfg, overwrite=True)
    assert first[hook]["k"] == 3 and again[hook]["k"] == 5
    assert AtlasLayout(tmp_path).read_meta()["saes"][first[hook]["sae_id"]]["k"] == 5


def test_default_learning_rate_recovers_the_dictionary_in_a_bounded_run(atoms: torch.Tensor) -> None:
    """Pins the defaults: a TopK SAE with nothing but its size and budget set recovers the
    planted atoms within STEPS steps; the long-run rate (gao2024) does not get there."""
    data = [7.0 * b for b in planted_batches(atoms, BATCH, STEPS, active=ACTIVE)]
    found = {}
    for rule in ("budget", "gao2024"):
        cfg = TrainConfig(total_tokens=BATCH * STEPS, batch_size=BATCH, lr_rule=rule, progress=False)
        found[rule] = recovery(train_sae(SAEConfig("topk", D_IN, D_SAE, k=ACTIVE), data, cfg).sae.W_dec, atoms)
    assert found["budget"] >= 0.9 > found["gao2024"]
