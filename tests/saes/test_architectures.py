"""Architectures: construction, sparsity rules, STE gradients, fast TopK = dense TopK, and
the registry (a new architecture is one class and one registration)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.importing.guard import check_sae
from sae_atlas.saes.sae.architectures import ARCHITECTURES, build_sae
from sae_atlas.saes.sae.base import (
    SAE,
    SAEConfig,
    architecture_class,
    architecture_names,
    register_architecture,
    unregister_architecture,
)
from sae_atlas.saes.sae.batchtopk import threshold_rate
from sae_atlas.saes.sae.fast_topk import topk_sparse_forward
from sae_atlas.saes.sae.losses import (
    StepInfo,
    TrainStep,
    auxk_select,
    dead_topk,
    fired_counts,
    step_metrics,
)
from sae_atlas.saes.sae.matryoshka import matryoshka_prefixes
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread, write_planted_atlas  # noqa: F401


def _cfg(arch: str, d_in: int = 16, d_sae: int = 64, **kw) -> SAEConfig:
    k = kw.pop("k", 4 if architecture_class(arch).needs_k else None)
    return SAEConfig(arch, d_in, d_sae, k=k, **kw)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_build_sae_is_seeded_unit_norm_and_tied(arch: str) -> None:
    a, b, c = build_sae(_cfg(arch, seed=1)), build_sae(_cfg(arch, seed=1)), build_sae(_cfg(arch, seed=2))
    assert isinstance(a, SAE)
    assert torch.equal(a.W_dec, b.W_dec) and not torch.equal(a.W_dec, c.W_dec)
    assert torch.allclose(a.W_dec.norm(dim=-1), torch.ones(64), atol=1e-6)
    assert torch.equal(a.W_enc, a.W_dec.T)
    out = a(torch.randn(5, 16))
    assert out.x_hat.shape == (5, 16) and out.feature_acts.shape == (5, 64)


def test_threshold_parameters_follow_the_format_contract() -> None:
    jr = build_sae(_cfg("jumprelu", jumprelu_init_threshold=0.25))
    assert jr.log_threshold.shape == (64,)
    assert torch.allclose(jr.threshold, torch.full((64,), 0.25))
    for arch in ("batchtopk", "matryoshka"):
        sae = build_sae(_cfg(arch))
        assert "threshold" in dict(sae.named_buffers()) and sae.threshold.shape == (64,)


def test_topk_never_exceeds_k_and_keeps_the_largest() -> None:
    torch.manual_seed(0)
    for k in (1, 3, 7):
        sae = build_sae(_cfg("topk", k=k))
        x = torch.randn(200, 16) * 3
        f = sae.encode(x)
        assert int((f != 0).sum(-1).max()) <= k
        pre = sae.encode_pre(x).relu()
        kth = pre.topk(k, dim=-1).values[:, -1:]
        assert torch.all(f[f != 0] >= kth.expand_as(f)[f != 0])


def test_batchtopk_trains_on_batch_topk_and_infers_with_threshold() -> None:
    torch.manual_seed(0)
    sae = build_sae(_cfg("batchtopk", k=4))
    x = torch.randn(32, 16)
    sae.train()
    f = sae.encode(x)
    assert int((f != 0).sum()) == 4 * 32
    assert (f != 0).sum(-1).max() > (f != 0).sum(-1).min()  # varies per token
    sae.eval()
    sae.threshold.fill_(0.3)
    pre = sae.encode_pre(x)
    assert torch.equal(sae.encode(x), pre.relu() * (pre.relu() > 0.3))


def test_batchtopk_threshold_starts_from_first_batch_and_converges() -> None:
    torch.manual_seed(0)
    sae = build_sae(_cfg("batchtopk", k=4))
    x = torch.randn(64, 16)
    sae.training_loss(x, StepInfo(step=0, total_steps=100))
    f = sae.activate(sae.encode_pre(x))
    assert math.isclose(float(sae.threshold[0]), float(f[f > 0].min().detach()), rel_tol=1e-6)
    assert threshold_rate(0, 100) == 1.0 and threshold_rate(500, 100) == 0.1
    assert threshold_rate(10**6, 10**6) == 1e-3


def test_jumprelu_straight_through_gradients() -> None:
    sae = build_sae(_cfg("jumprelu", d_in=2, d_sae=1, jumprelu_bandwidth=0.2, jumprelu_init_threshold=0.5))
    from sae_atlas.saes.sae.jumprelu import _JumpReLU, _Step

    pre = torch.tensor([[0.45], [0.58], [0.9], [0.2]], requires_grad=True)
    theta = 0.5
    f = _JumpReLU.apply(pre, sae.log_threshold, 0.2)
    assert torch.equal(f.detach().squeeze(), torch.tensor([0.0, 0.58, 0.9, 0.0]))
    f.sum().backward()
    assert torch.equal(pre.grad.squeeze(), torch.tensor([0.0, 1.0, 1.0, 0.0]))
    # two pre-activations (0.45, 0.58) lie within bandwidth/2 of theta
    expected = -(theta / 0.2) * 2 * theta  # d/dlog(theta) = theta * d/dtheta
    assert math.isclose(float(sae.log_threshold.grad), expected, rel_tol=1e-5)
    sae.log_threshold.grad = None
    pre2 = pre.detach().requires_grad_()
    _Step.apply(pre2, sae.log_threshold, 0.2).sum().backward()
    assert pre2.grad is None or torch.all(pre2.grad == 0)
    assert math.isclose(float(sae.log_threshold.grad), -(1 / 0.2) * 2 * theta, rel_tol=1e-5)


@pytest.mark.parametrize("apply_b_dec", [True, False])
def test_fast_topk_gradients_equal_dense(apply_b_dec: bool) -> None:
    torch.manual_seed(0)
    sae = build_sae(_cfg("topk", d_in=24, d_sae=96, k=5, apply_b_dec_to_input=apply_b_dec)).double()
    with torch.no_grad():
        sae.b_dec.normal_()
        sae.b_enc.normal_(0, 0.2)
    x = torch.randn(40, 24, dtype=torch.float64) * 2
    dead = torch.zeros(96, dtype=torch.bool)
    dead[::3] = True
    for info in (StepInfo(), StepInfo(dead_mask=dead, k_aux=12, data_variance=3.0)):
        grads, losses = [], []
        for fast in (True, False):
            sae.zero_grad()
            out = sae.training_loss(x, info, fast=fast)
            out.loss.backward()
            losses.append(out)
            grads.append({n: p.grad.clone() for n, p in sae.named_parameters()})
        assert torch.allclose(losses[0].loss, losses[1].loss, rtol=1e-12)
        assert torch.equal(losses[0].fired, losses[1].fired)
        assert ("auxk" in losses[0].metrics) == (info.dead_mask is not None)
        for name in grads[0]:
            assert torch.allclose(grads[0][name], grads[1][name], rtol=1e-9, atol=1e-12), name


def test_fast_topk_output_matches_encode_decode() -> None:
    torch.manual_seed(1)
    sae = build_sae(_cfg("topk", k=3))
    x = torch.randn(10, 16)
    out = topk_sparse_forward(sae, x)
    assert torch.allclose(out.x_hat, sae(x).x_hat, atol=1e-5)
    assert out.idx.shape == (10, 3)


def test_matryoshka_prefixes_default_and_validation() -> None:
    assert matryoshka_prefixes(_cfg("matryoshka", d_sae=64)) == [4, 8, 16, 32, 64]
    assert matryoshka_prefixes(_cfg("matryoshka", matryoshka_prefixes=[16, 64])) == [16, 64]
    with pytest.raises(InvalidInputError, match="matryoshka_prefixes"):
        build_sae(_cfg("matryoshka", matryoshka_prefixes=[32, 16, 64]))
    with pytest.raises(InvalidInputError, match="matryoshka_prefixes"):
        build_sae(_cfg("matryoshka", matryoshka_prefixes=[16, 32]))


def test_standard_l1_is_weighted_by_decoder_norm_and_warmed_up() -> None:
    torch.manual_seed(0)
    sae = build_sae(_cfg("standard", l1_coefficient=2.0, l1_warmup_steps=10))
    x = torch.randn(8, 16)
    early = sae.training_loss(x, StepInfo(step=0))
    late = sae.training_loss(x, StepInfo(step=100))
    l1 = float(late.metrics["l1"])
    assert math.isclose(float(late.loss), float(late.metrics["mse"]) + 2.0 * l1, rel_tol=1e-5)
    assert math.isclose(float(early.loss), float(early.metrics["mse"]) + 0.2 * l1, rel_tol=1e-5)
    with torch.no_grad():
        sae.W_dec.mul_(2.0)
    assert math.isclose(float(sae.training_loss(x, StepInfo(step=100)).metrics["l1"]), 2 * l1, rel_tol=1e-5)


def test_wrong_input_width_is_rejected() -> None:
    with pytest.raises(InvalidInputError, match="d_in=16"):
        build_sae(_cfg("topk")).training_loss(torch.randn(3, 8), StepInfo())


def test_dead_topk_picks_the_largest_dead_latents_only():
    pre = torch.tensor([[9.0, 1.0, 5.0, 3.0, 7.0], [0.0, 8.0, -1.0, 6.0, 2.0]], requires_grad=True)
    dead = torch.tensor([False, True, True, True, False])
    idx = dead_topk(pre, dead, 2)
    assert [sorted(row) for row in idx.tolist()] == [[2, 3], [1, 3]]
    assert dead_topk(pre, dead, 0) is None and dead_topk(pre, None, 2) is None
    assert dead_topk(pre, torch.zeros(5, dtype=torch.bool), 2) is None
    assert dead_topk(pre, dead, 10).shape == (2, 3)  # at most the number of dead latents
    vals, idx = auxk_select(pre, dead, 2)
    assert torch.equal(vals, pre.gather(1, idx)) and vals.requires_grad


def test_the_registry_is_the_one_list_of_architectures():
    assert architecture_names() == ARCHITECTURES == ("standard", "topk", "batchtopk", "jumprelu", "matryoshka")
    for name in ARCHITECTURES:
        assert architecture_class(name).architecture == name
    with pytest.raises(InvalidInputError, match="unknown SAE architecture 'gated'; valid: standard, topk"):
        SAEConfig("gated", 4, 8)
    for name in ("topk", "batchtopk", "matryoshka"):  # the architectures declaring needs_k
        with pytest.raises(InvalidInputError, match=f"{name} needs 0 < k <= d_sae \\(8\\), got k=None"):
            SAEConfig(name, 4, 8)
    assert SAEConfig("jumprelu", 4, 8).k is None


class FixedThresholdSAE(SAE):
    """A sixth architecture defined by a test: a JumpReLU at a fixed (untrained) threshold,
    trained on FVU plus an L1 penalty."""

    architecture = "fixed_threshold"
    saelens_architecture = "jumprelu"
    has_threshold = True

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("threshold", torch.full((cfg.d_sae,), 0.5))

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return pre * (pre > self.threshold)

    def training_loss(self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None) -> TrainStep:
        f = self.activate(self.encode_pre(x))
        metrics = step_metrics(x if target is None else target, self.decode(f), (f != 0).sum(-1), info)
        loss = metrics["fvu"] + self.cfg.l1_coefficient * f.abs().sum(-1).mean()
        return TrainStep(loss, {k: v.detach() for k, v in metrics.items()}, fired_counts(f))

    @torch.no_grad()
    def divide_thresholds(self, divisor: float) -> None:
        self.threshold.div_(divisor)


@pytest.fixture
def fixed_threshold() -> Iterator[type[SAE]]:
    """`FixedThresholdSAE` registered for one test (the others see the built-in five)."""
    register_architecture(FixedThresholdSAE)
    yield FixedThresholdSAE
    unregister_architecture(FixedThresholdSAE.architecture)


def test_registration_checks_the_declarations(fixed_threshold) -> None:
    with pytest.raises(InvalidInputError, match="'fixed_threshold' is already registered"):
        register_architecture(FixedThresholdSAE)

    class Undeclared(SAE):
        architecture = "undeclared"

    with pytest.raises(InvalidInputError, match="must declare saelens_architecture"):
        register_architecture(Undeclared)
    with pytest.raises(InvalidInputError, match="unknown SAE architecture 'undeclared'"):
        unregister_architecture("undeclared")
    assert architecture_names() == (*ARCHITECTURES, "fixed_threshold")


def test_a_new_architecture_is_one_class_and_one_registration(fixed_threshold, tmp_path: Path) -> None:
    """Built from its config, trained by the atlas trainer (input scale folded into its
    threshold), saved in the SAELens layout, loaded back, read by SAELens as a JumpReLU and
    checked by the misload guard: all from the class's declarations."""
    name = fixed_threshold.architecture
    assert isinstance(build_sae(SAEConfig(name, 8, 16)), FixedThresholdSAE)
    hook = "blocks.0.hook_resid_post"
    write_planted_atlas(tmp_path, [hook], n_blocks=20)
    train_cfg = TrainConfig(total_tokens=64 * 4, batch_size=64, progress=False, scale_batches=2)
    summary = train_saes(tmp_path, [hook], architecture=name, d_sae=64, sae_options={"l1_coefficient": 1e-3},
                         train_cfg=train_cfg)[hook]
    sae_id = summary["sae_id"]
    assert sae_id == f"{hook}-{name}-64" and summary["k"] is None  # k=32 is dropped: no needs_k
    assert AtlasLayout(tmp_path).read_meta()["saes"][sae_id]["architecture"] == name
    folder = AtlasLayout(tmp_path).sae_dir(sae_id)
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["architecture"] == "jumprelu" and cfg["sae_atlas"]["sae_config"]["architecture"] == name
    assert json.loads((folder / "training.json").read_text())["sae_config"]["l1_coefficient"] == 1e-3

    sae = load_atlas_sae(tmp_path, sae_id)
    assert type(sae) is FixedThresholdSAE and sae.cfg.d_sae == 64
    assert torch.allclose(sae.threshold, torch.full((64,), 0.5 / summary["input_scale"]))
    rows = next(iter(ActivationReader(tmp_path, hook).blocks(split="heldout"))).acts.reshape(-1, 32).float()
    plain = load_saelens(folder, native=False)
    assert plain.cfg.architecture == "jumprelu"
    assert torch.allclose(plain(rows).x_hat, sae(rows).x_hat, atol=1e-5)

    lost = load_atlas_sae(tmp_path, sae_id)
    lost.threshold.zero_()
    acts = lost(rows).feature_acts
    metrics = {"fvu": 0.1, "l0": float((acts != 0).sum(-1).float().mean()), "dead_fraction": 0.0}
    assert [p.cause for p in check_sae(lost, rows, metrics, hook=hook)][:1] == ["threshold"]


def test_sae_config_from_dict_rejects_unknown_keys_and_bad_dtypes():
    cfg = SAEConfig("topk", 4, 8, k=2, dtype="torch.bfloat16")
    assert cfg.dtype == "bfloat16" and SAEConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(InvalidInputError, match=r"unknown SAE config keys \['l1_coeff'\]; valid: .*l1_coefficient"):
        SAEConfig.from_dict({**cfg.to_dict(), "l1_coeff": 1.0})
    with pytest.raises(InvalidInputError, match="unknown SAE dtype 'int8'"):
        SAEConfig("topk", 4, 8, k=2, dtype="int8")
