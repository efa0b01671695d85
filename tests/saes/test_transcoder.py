"""Transcoders as SAEs that write another hook: the config contract, forward = decode +
skip, exact SAELens-layout round trips, the atlas.json record, and an exact transcoder of
a tiny model's ReLU MLP (its own weights) predicting the MLP output."""

import json

import pytest
import torch
from safetensors.torch import load_file

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_records import trained_record
from sae_atlas.saes.formats import load_saelens, save_saelens
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.sae.losses import StepInfo

IN, OUT = "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"


def transcoder(arch: str, *, skip: bool = False, d_in: int = 8, d_out: int = 6, d_sae: int = 24):
    """A transcoder with non-trivial biases, thresholds and skip weights."""
    cfg = SAEConfig(architecture=arch, d_in=d_in, d_sae=d_sae, k=4, seed=3, hook_name=IN, hook_name_out=OUT,
                    d_out=d_out, skip=skip, apply_b_dec_to_input=False, model_name="tiny")
    sae = build_sae(cfg)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        sae.b_enc.copy_(0.1 * torch.randn(d_sae, generator=gen))
        sae.b_dec.copy_(torch.randn(d_out, generator=gen))
        if skip:
            sae.W_skip.copy_(torch.randn(d_in, d_out, generator=gen))
        if arch == "jumprelu":
            sae.log_threshold.copy_(torch.log(0.05 + 0.2 * torch.rand(d_sae, generator=gen)))
        if arch in ("batchtopk", "matryoshka"):
            sae.threshold.fill_(0.15)
    return sae.eval()


def test_contract_shapes_and_forward():
    sae = transcoder("topk", skip=True)
    assert sae.is_transcoder and sae.cfg.output_dim == 6 and sae.cfg.output_hook == OUT
    assert (tuple(sae.W_enc.shape), tuple(sae.W_dec.shape), tuple(sae.b_dec.shape), tuple(sae.W_skip.shape)) == (
        (8, 24), (24, 6), (6,), (8, 6))
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    acts = sae.encode(x)
    assert torch.allclose(acts, (x @ sae.W_enc + sae.b_enc).relu().topk(4).values.new_zeros(5, 24).scatter(
        1, (x @ sae.W_enc + sae.b_enc).topk(4).indices, (x @ sae.W_enc + sae.b_enc).topk(4).values.relu()))
    out = sae(x)
    assert torch.allclose(out.x_hat, acts @ sae.W_dec + sae.b_dec + x @ sae.W_skip, atol=1e-6)
    assert torch.allclose(sae.decode(acts), acts @ sae.W_dec + sae.b_dec)  # no skip term
    assert torch.allclose(sae.skip_out(x), x @ sae.W_skip)
    plain = transcoder("standard")
    assert not plain.cfg.skip and torch.equal(plain.skip_out(x), torch.zeros(5, 6))
    assert not build_sae(SAEConfig(architecture="topk", d_in=8, d_sae=16, k=2)).is_transcoder


def test_config_errors_and_sae_dict_unchanged():
    with pytest.raises(InvalidInputError, match="apply_b_dec_to_input=False"):
        SAEConfig(architecture="standard", d_in=4, d_sae=8, hook_name_out=OUT)
    with pytest.raises(InvalidInputError, match="hook_name_out"):
        SAEConfig(architecture="standard", d_in=4, d_sae=8, skip=True)
    with pytest.raises(InvalidInputError, match="hook_name_out"):
        SAEConfig(architecture="standard", d_in=4, d_sae=8, d_out=3)
    # an SAE's config dict has no transcoder keys, so records written before them still match
    assert not {"hook_name_out", "d_out", "skip"} & set(SAEConfig(architecture="standard", d_in=4, d_sae=8).to_dict())
    tc = transcoder("standard", skip=True).cfg
    assert SAEConfig.from_dict(tc.to_dict()) == tc


@pytest.mark.parametrize(("arch", "skip", "saelens_name"), [
    ("standard", False, "transcoder"), ("standard", True, "skip_transcoder"),
    ("jumprelu", False, "jumprelu_transcoder"), ("topk", True, "topk_transcoder"),
    ("batchtopk", False, "jumprelu_transcoder"), ("matryoshka", True, "matryoshka_transcoder"),
])
def test_round_trip_is_exact(tmp_path, arch, skip, saelens_name):
    sae = transcoder(arch, skip=skip)
    save_saelens(sae, tmp_path / "tc")
    raw = json.loads((tmp_path / "tc" / "cfg.json").read_text())
    assert raw["architecture"] == saelens_name and raw["d_out"] == 6 and raw["apply_b_dec_to_input"] is False
    assert raw["metadata"]["hook_name"] == IN and raw["metadata"]["hook_name_out"] == OUT
    weights = load_file(tmp_path / "tc" / "sae_weights.safetensors")
    assert tuple(weights["W_dec"].shape) == (24, 6)
    if skip:  # SAELens holds W_skip as [d_out, d_in]
        assert torch.equal(weights["W_skip"], sae.W_skip.detach().T)
    loaded = load_saelens(tmp_path / "tc", expected_d_in=8)
    assert type(loaded) is type(sae) and loaded.cfg == sae.cfg
    for name, tensor in sae.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(2)) * 2
    assert torch.equal(sae(x).x_hat, loaded(x).x_hat)
    if saelens_name in ("transcoder", "skip_transcoder", "jumprelu_transcoder"):
        # read the way SAELens reads it (our section ignored): the same outputs
        foreign = load_saelens(tmp_path / "tc", native=False)
        assert foreign.is_transcoder and foreign.cfg.hook_name_out == OUT and foreign.cfg.skip == skip
        assert torch.allclose(foreign(x).x_hat, sae(x).x_hat, atol=1e-6)
        assert torch.allclose(foreign.encode(x), sae.encode(x), atol=1e-6)


def test_atlas_record_names_both_hooks():
    cfg = transcoder("topk", skip=True).cfg
    record = trained_record("tc", cfg, {"train_config": {"total_tokens": 10}})
    assert (record["hook"], record["hook_out"], record["d_out"], record["skip"]) == (IN, OUT, 6, True)
    sae_record = trained_record("sae", SAEConfig(architecture="topk", d_in=8, d_sae=16, k=2, hook_name=IN),
                                {"train_config": {"total_tokens": 10}})
    assert "hook_out" not in sae_record


@pytest.mark.parametrize("arch", ["standard", "topk", "jumprelu", "batchtopk", "matryoshka"])
def test_training_loss_predicts_the_target(arch):
    """The loss measures the output against the target, not the input: a transcoder that
    predicts `y` exactly through its skip term has zero error on (x, y) and not on (x, x)."""
    sae = transcoder(arch, skip=True, d_out=8).train()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        sae.W_dec.zero_()
        sae.b_dec.zero_()
    y = sae.skip_out(x).detach()
    info = StepInfo(step=10, total_steps=100)
    assert float(sae.training_loss(x, info, y).metrics["mse"]) < 1e-10
    assert float(sae.training_loss(x, info).metrics["mse"]) > 1.0


def mlp_transcoder(handle, layer: int):
    """The exact transcoder of a ReLU MLP: its own weights (standard architecture)."""
    mlp = handle.bridge.blocks[layer].mlp
    d_model, d_mlp = mlp.W_in.shape
    sae = build_sae(SAEConfig(architecture="standard", d_in=d_model, d_sae=d_mlp, hook_name=f"blocks.{layer}.mlp.hook_in",
                              hook_name_out=f"blocks.{layer}.hook_mlp_out", apply_b_dec_to_input=False))
    with torch.no_grad():
        sae.W_enc.copy_(mlp.W_in)
        sae.b_enc.copy_(mlp.b_in)
        sae.W_dec.copy_(mlp.W_out)
        sae.b_dec.copy_(mlp.b_out)
    return sae.eval()


def test_exact_transcoder_of_a_relu_mlp():
    handle = tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)
    sae = mlp_transcoder(handle, 1)
    tokens = handle.to_tokens("the cat sat on the mat and the dog ran")
    _, cache = handle.bridge.run_with_cache(tokens, names_filter=[sae.cfg.hook_name, sae.cfg.hook_name_out])
    x, y = cache[sae.cfg.hook_name][0], cache[sae.cfg.hook_name_out][0]
    assert torch.allclose(sae(x).x_hat, y, atol=1e-5)
    assert float((sae.encode(x) > 0).float().mean()) < 0.9  # the ReLU code is sparse-ish, not linear
