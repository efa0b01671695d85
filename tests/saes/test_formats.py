"""SAE file formats: exact SAELens round trips, hand-made SAELens / sparsify /
dictionary_learning fixtures with hand-computed outputs, and clear errors on bad files."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.formats import (
    load_any,
    load_dictionary_learning,
    load_saelens,
    load_sparsify,
    save_saelens,
)
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ARCHS = ["standard", "topk", "batchtopk", "jumprelu", "matryoshka"]
# The hand-made fixtures share this encoder (see tests/fixtures/make_fixtures.py).
W_ENC = torch.tensor([[1.0, 0, 0, 0, 1, 0], [0, 1, 0, 0, 0, 1], [0, 0, 1, 0, -1, 0], [0, 0, 0, 1, 0, -1]])


def trained_like(arch: str, d_in: int = 8, d_sae: int = 32):
    """An SAE with non-trivial biases and thresholds (as after training)."""
    sae = build_sae(SAEConfig(architecture=arch, d_in=d_in, d_sae=d_sae, k=4, seed=3,
                              hook_name="blocks.1.hook_resid_post", model_name="tiny"))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        sae.b_enc.copy_(0.1 * torch.randn(d_sae, generator=gen))
        sae.b_dec.copy_(torch.randn(d_in, generator=gen))
        if arch == "jumprelu":
            sae.log_threshold.copy_(torch.log(0.05 + 0.2 * torch.rand(d_sae, generator=gen)))
        if arch in ("batchtopk", "matryoshka"):
            sae.threshold.fill_(0.15)
    return sae.eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_is_bitwise_exact(tmp_path, arch):
    sae = trained_like(arch)
    density = torch.rand(sae.cfg.d_sae, generator=torch.Generator().manual_seed(1))
    density[0] = 0.0
    save_saelens(sae, tmp_path / "sae", sparsity=density)
    loaded = load_saelens(tmp_path / "sae", expected_d_in=8)
    assert type(loaded) is type(sae) and loaded.cfg == sae.cfg
    original, again = sae.state_dict(), loaded.state_dict()
    assert original.keys() == again.keys()
    for name in original:
        assert torch.equal(original[name], again[name]), name
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(2)) * 2
    assert torch.equal(sae(x).x_hat, loaded(x).x_hat)
    assert torch.equal(sae(x).feature_acts, loaded(x).feature_acts)
    sparsity = load_file(tmp_path / "sae" / "sparsity.safetensors")["sparsity"]  # SAELens' layout
    assert torch.allclose(sparsity, torch.log10(density + 1e-10))
    assert sparsity[0] == pytest.approx(-10.0)


def test_saved_cfg_follows_saelens_layout(tmp_path):
    save_saelens(trained_like("batchtopk"), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    assert cfg["architecture"] == "jumprelu" and cfg["normalize_activations"] == "none"
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_post"
    assert cfg["metadata"]["sae_lens_training_version"] is None
    assert cfg["sae_atlas"]["sae_config"]["architecture"] == "batchtopk"
    assert set(load_file(tmp_path / "sae_weights.safetensors")) == {"W_enc", "b_enc", "W_dec", "b_dec", "threshold"}
    save_saelens(trained_like("topk"), tmp_path)  # overwrite: stale optional files go
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    assert cfg["k"] == 4 and cfg["rescale_acts_by_decoder_norm"] is False
    assert not (tmp_path / "sparsity.safetensors").exists()


@pytest.mark.parametrize("arch", ["batchtopk", "matryoshka", "jumprelu"])
def test_export_read_as_plain_saelens_gives_same_outputs(tmp_path, arch):
    sae = trained_like(arch)
    save_saelens(sae, tmp_path)
    plain = load_saelens(tmp_path, native=False)
    assert plain.cfg.architecture == "jumprelu"
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(4)) * 2
    ref, out = sae(x), plain(x)
    assert torch.equal(ref.feature_acts != 0, out.feature_acts != 0)
    assert torch.allclose(ref.x_hat, out.x_hat, atol=1e-6)


def test_hand_made_saelens_topk_fixture():
    sae = load_any(FIXTURES / "saelens_topk", expected_d_in=4)
    assert sae.cfg.architecture == "topk" and sae.cfg.k == 2
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post" and sae.cfg.context_size == 16
    # x - b_dec = [1, 2, 3, -1]; pre = [1, 2, 3, -1, -1.5, 3]; top-2 keeps latents 2 and 5.
    out = sae(torch.tensor([[1.1, 2.0, 3.0, -1.0]]))
    assert torch.allclose(out.feature_acts, torch.tensor([[0.0, 0, 3, 0, 0, 3]]))
    assert torch.allclose(out.x_hat, torch.tensor([[0.1, 3.0, 3.0, -3.0]]))


def test_hand_made_legacy_saelens_fixture():
    sae = load_saelens(FIXTURES / "saelens_legacy")
    assert sae.cfg.architecture == "standard" and sae.cfg.hook_name == "blocks.0.hook_resid_pre"
    assert sae.cfg.model_name == "gpt2-small" and sae.cfg.context_size == 128
    # x - b_dec = [1, -2, 0, 0]; relu(pre) fires latents 0 and 4; W_dec = W_enc.T / 2.
    out = sae(torch.tensor([[1.0, -2.0, 0.0, 0.5]]))
    assert torch.allclose(out.x_hat, torch.tensor([[1.0, 0.0, -0.5, 0.5]]))


def test_hand_made_saelens_jumprelu_fixture():
    sae = load_saelens(FIXTURES / "saelens_jumprelu")
    assert sae.cfg.architecture == "jumprelu" and not sae.cfg.apply_b_dec_to_input
    # pre = [1, .3, 2, -1, -1, 1.3] against thresholds [.5, .5, 2.5, .5, .5, .5].
    out = sae(torch.tensor([[1.0, 0.3, 2.0, -1.0]]))
    assert torch.allclose(out.feature_acts, torch.tensor([[1.0, 0, 0, 0, 0, 1.3]]))
    assert torch.allclose(out.x_hat, torch.tensor([[2.0, 2.3, 1.0, -0.3]]))


def test_saelens_topk_with_decoder_norm_rescaling_is_folded(tmp_path):
    shutil.copytree(FIXTURES / "saelens_topk", tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    cfg["rescale_acts_by_decoder_norm"] = True
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    weights = load_file(tmp_path / "sae_weights.safetensors")
    scale = torch.tensor([1.0, 1.0, 1.0, 1.0, 4.0, 0.5])
    weights["W_dec"] = weights["W_dec"] * scale[:, None]
    save_file(weights, tmp_path / "sae_weights.safetensors")
    sae = load_saelens(tmp_path)
    # SAELens: hidden = pre * ||W_dec_i|| (norms sqrt2*4, sqrt2/2 for 4, 5), top-2, decode f / norm.
    x = torch.tensor([[1.1, 2.0, 3.0, -1.0]])
    pre = (x - weights["b_dec"]) @ weights["W_enc"] + weights["b_enc"]
    hidden = pre * weights["W_dec"].norm(dim=-1)
    top = hidden.topk(2, dim=-1)
    f = torch.zeros_like(hidden).scatter_(-1, top.indices, top.values.relu())
    expected = (f / weights["W_dec"].norm(dim=-1)) @ weights["W_dec"] + weights["b_dec"]
    assert torch.allclose(sae(x).x_hat, expected, atol=1e-6)
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(6))


def write_sparsify(folder: Path, **cfg_overrides) -> dict:
    folder.mkdir(parents=True)
    cfg = {"activation": "topk", "expansion_factor": 32, "normalize_decoder": True, "num_latents": 6,
           "k": 2, "multi_topk": False, "skip_connection": False, "transcode": False, "d_in": 4}
    cfg.update(cfg_overrides)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    tensors = {"encoder.weight": W_ENC.T.contiguous(), "encoder.bias": torch.tensor([0.0, 0, 0, 0, 0.5, 0]),
               "W_dec": W_ENC.T.contiguous(), "b_dec": torch.tensor([0.1, 0.0, 0.0, 0.0])}
    save_file(tensors, folder / "sae.safetensors")
    return tensors


def test_sparsify_folder_loads_as_topk(tmp_path):
    write_sparsify(tmp_path / "layers.1")
    sae = load_any(tmp_path / "layers.1", expected_d_in=4)
    assert sae.cfg.architecture == "topk" and sae.cfg.k == 2 and sae.cfg.d_sae == 6
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post"
    out = sae(torch.tensor([[1.1, 2.0, 3.0, -1.0]]))  # same numbers as the SAELens fixture
    assert torch.allclose(out.x_hat, torch.tensor([[0.1, 3.0, 3.0, -3.0]]))
    write_sparsify(tmp_path / "wide", num_latents=0, expansion_factor=2, d_in=3)
    with pytest.raises(IntegrityError, match=r"encoder.weight.*shape \(6, 4\), expected \(6, 3\)"):
        load_sparsify(tmp_path / "wide")
    write_sparsify(tmp_path / "tc", transcode=True)
    with pytest.raises(InvalidInputError, match="transcode"):
        load_sparsify(tmp_path / "tc")


def write_dictionary_learning(folder: Path, state: dict, dict_class: str | None, **trainer) -> None:
    folder.mkdir(parents=True)
    torch.save(state, folder / "ae.pt")
    if dict_class is not None:
        config = {"trainer": {"dict_class": dict_class, "lm_name": "EleutherAI/pythia-70m-deduped",
                              "submodule_name": "resid_post_layer_3", **trainer},
                  "buffer": {"ctx_len": 128, "d_submodule": 4}}
        (folder / "config.json").write_text(json.dumps(config))


def test_dictionary_learning_standard_autoencoder(tmp_path):
    state = {"bias": torch.tensor([0.0, 0.0, 0.0, 0.5]), "encoder.weight": W_ENC.T.contiguous(),
             "encoder.bias": torch.zeros(6), "decoder.weight": (0.5 * W_ENC).contiguous()}
    write_dictionary_learning(tmp_path / "ae", state, None)
    sae = load_any(tmp_path / "ae")
    assert sae.cfg.architecture == "standard" and sae.cfg.apply_b_dec_to_input
    # Same numbers as the legacy SAELens fixture.
    assert torch.allclose(sae(torch.tensor([[1.0, -2.0, 0.0, 0.5]])).x_hat, torch.tensor([[1.0, 0.0, -0.5, 0.5]]))


def test_dictionary_learning_topk_and_batchtopk(tmp_path):
    state = {"k": torch.tensor(2, dtype=torch.int), "threshold": torch.tensor(2.5),
             "encoder.weight": W_ENC.T.contiguous(), "encoder.bias": torch.tensor([0.0, 0, 0, 0, 0.5, 0]),
             "decoder.weight": W_ENC.contiguous(), "b_dec": torch.tensor([0.1, 0.0, 0.0, 0.0])}
    write_dictionary_learning(tmp_path / "topk", state, "AutoEncoderTopK", k=2)
    sae = load_dictionary_learning(tmp_path / "topk")
    assert sae.cfg.architecture == "topk" and sae.cfg.hook_name == "blocks.3.hook_resid_post"
    assert sae.cfg.model_name == "EleutherAI/pythia-70m-deduped" and sae.cfg.context_size == 128
    x = torch.tensor([[1.1, 2.0, 3.0, -1.0]])
    assert torch.allclose(sae(x).x_hat, torch.tensor([[0.1, 3.0, 3.0, -3.0]]))
    write_dictionary_learning(tmp_path / "batch", state, "BatchTopKSAE", k=2)
    sae = load_dictionary_learning(tmp_path / "batch")
    # relu(pre) = [1, 2, 3, 0, 0, 3] against the shared threshold 2.5: latents 2 and 5 pass.
    assert sae.cfg.architecture == "batchtopk"
    assert torch.allclose(sae(x).feature_acts, torch.tensor([[0.0, 0, 3, 0, 0, 3]]))
    write_dictionary_learning(tmp_path / "noconfig", state, None)
    with pytest.raises(InvalidInputError, match="config.json"):
        load_any(tmp_path / "noconfig")


def test_dictionary_learning_jumprelu_folds_decoder_norms(tmp_path):
    W_dec = W_ENC.T.contiguous() * torch.tensor([2.0, 1, 1, 1, 1, 3])[:, None]
    state = {"W_enc": W_ENC, "b_enc": torch.zeros(6), "W_dec": W_dec, "b_dec": torch.ones(4),
             "threshold": torch.tensor([0.5, 0.5, 2.5, 0.5, 0.5, 0.5])}
    write_dictionary_learning(tmp_path / "jump", state, "JumpReluAutoEncoder")
    sae = load_any(tmp_path / "jump")
    assert sae.cfg.architecture == "jumprelu" and not sae.cfg.apply_b_dec_to_input
    # dictionary_learning: f = jump(pre) * ||W_dec_i|| = [1*2, 0, 0, 0, 0, 1.3*3*sqrt2], x_hat = jump(pre) @ W_dec + b.
    out = sae(torch.tensor([[1.0, 0.3, 2.0, -1.0]]))
    norms = W_dec.norm(dim=-1)
    assert torch.allclose(out.feature_acts, torch.tensor([[1.0, 0, 0, 0, 0, 1.3]]) * norms, atol=1e-6)
    expected = torch.tensor([[1.0, 0, 0, 0, 0, 1.3]]) @ W_dec + 1
    assert torch.allclose(out.x_hat, expected, atol=1e-6)


def test_dictionary_learning_matryoshka(tmp_path):
    state = {"W_enc": W_ENC, "b_enc": torch.zeros(6), "W_dec": W_ENC.T.contiguous(), "b_dec": torch.zeros(4),
             "k": torch.tensor(2, dtype=torch.int), "threshold": torch.tensor(-1.0),
             "group_sizes": torch.tensor([2, 4])}
    write_dictionary_learning(tmp_path / "m", state, "MatryoshkaBatchTopKSAE")
    sae = load_any(tmp_path / "m")
    assert sae.cfg.architecture == "matryoshka" and sae.cfg.matryoshka_prefixes == [2, 6]
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    assert torch.allclose(sae(x).feature_acts, ((x @ W_ENC).relu()))  # unset threshold: plain relu


def test_unsupported_dictionary_class(tmp_path):
    write_dictionary_learning(tmp_path / "g", {"encoder.weight": torch.zeros(6, 4)}, "GatedAutoEncoder")
    with pytest.raises(InvalidInputError, match="GatedAutoEncoder.*supported"):
        load_any(tmp_path / "g")


def test_truncated_weights_name_the_file(tmp_path):
    save_saelens(trained_like("topk"), tmp_path / "ours")
    weights = tmp_path / "ours" / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-40])
    with pytest.raises(IntegrityError, match=r"sae_weights.safetensors: sha256 does not match.*retrain"):
        load_saelens(tmp_path / "ours")
    shutil.copytree(FIXTURES / "saelens_topk", tmp_path / "theirs")
    weights = tmp_path / "theirs" / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-40])
    with pytest.raises(IntegrityError, match="sae_weights.safetensors: not a readable safetensors file"):
        load_saelens(tmp_path / "theirs")
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / "ae.pt").write_bytes(b"\x80\x02garbage")
    with pytest.raises(IntegrityError, match="ae.pt: not a readable torch state dict"):
        load_any(tmp_path / "dl")


def test_wrong_shape_missing_tensor_and_corrupt_cfg(tmp_path):
    shutil.copytree(FIXTURES / "saelens_topk", tmp_path / "shape")
    cfg = json.loads((tmp_path / "shape" / "cfg.json").read_text())
    (tmp_path / "shape" / "cfg.json").write_text(json.dumps({**cfg, "d_sae": 7}))
    with pytest.raises(IntegrityError, match=r"'W_enc' has shape \(4, 6\), expected \(4, 7\)"):
        load_saelens(tmp_path / "shape")
    shutil.copytree(FIXTURES / "saelens_topk", tmp_path / "missing")
    weights = load_file(FIXTURES / "saelens_topk" / "sae_weights.safetensors")
    del weights["b_enc"]
    save_file(weights, tmp_path / "missing" / "sae_weights.safetensors")
    with pytest.raises(IntegrityError, match="'b_enc' is missing"):
        load_saelens(tmp_path / "missing")
    shutil.copytree(FIXTURES / "saelens_topk", tmp_path / "corrupt")
    (tmp_path / "corrupt" / "cfg.json").write_text('{"d_in": 4, "d_sae": ')
    with pytest.raises(IntegrityError, match="cfg.json: not valid JSON"):
        load_saelens(tmp_path / "corrupt")
    save_saelens(trained_like("standard"), tmp_path / "ours")
    weights = tmp_path / "ours" / "sae_weights.safetensors"
    tensors = load_file(weights)
    tensors["b_dec"] = tensors["b_dec"] + 1
    save_file(tensors, weights)  # a well-formed file that is not the one we wrote
    with pytest.raises(IntegrityError, match="sha256 does not match"):
        load_saelens(tmp_path / "ours")


def test_d_in_mismatch_and_unsupported_settings(tmp_path):
    with pytest.raises(InvalidInputError, match=r"saelens_topk/cfg.json: SAE has d_in=4 but the target hook has d_model=32"):
        load_saelens(FIXTURES / "saelens_topk", expected_d_in=32)
    shutil.copytree(FIXTURES / "saelens_topk", tmp_path / "norm")
    cfg = json.loads((tmp_path / "norm" / "cfg.json").read_text())
    (tmp_path / "norm" / "cfg.json").write_text(json.dumps({**cfg, "normalize_activations": "expected_average_only_in"}))
    with pytest.raises(InvalidInputError, match="normalize_activations"):
        load_saelens(tmp_path / "norm")
    (tmp_path / "norm" / "cfg.json").write_text(json.dumps({**cfg, "architecture": "gated"}))
    with pytest.raises(InvalidInputError, match="'gated' is not supported"):
        load_saelens(tmp_path / "norm")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInputError, match="no SAE found"):
        load_any(tmp_path / "empty")
    with pytest.raises(InvalidInputError, match=r"sparsity must be the per-latent firing density"):
        save_saelens(trained_like("topk"), tmp_path / "bad", sparsity=torch.full((32,), -3.0))


@pytest.mark.parametrize("name", ["standard", "topk_rescale", "jumprelu"])
def test_folders_written_by_real_saelens_give_saelens_outputs(name):
    io = load_file(FIXTURES / "saelens_written" / "io.safetensors")
    sae = load_any(FIXTURES / "saelens_written" / name, expected_d_in=8)
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post"
    out = sae(io["x"])
    assert torch.allclose(out.feature_acts, io[f"{name}_f"], atol=1e-5)
    assert torch.allclose(out.x_hat, io[f"{name}_x_hat"], atol=1e-5)


def test_legacy_topk_config_and_log_threshold_variants(tmp_path):
    shutil.copytree(FIXTURES / "saelens_legacy", tmp_path / "topk")
    cfg = json.loads((tmp_path / "topk" / "cfg.json").read_text())
    cfg.update(activation_fn_str="topk", activation_fn_kwargs={"k": 2})
    (tmp_path / "topk" / "cfg.json").write_text(json.dumps(cfg))
    sae = load_saelens(tmp_path / "topk")
    assert sae.cfg.architecture == "topk" and sae.cfg.k == 2
    assert torch.allclose(sae(torch.tensor([[1.0, -2.0, 0.0, 0.5]])).x_hat, torch.tensor([[1.0, 0.0, -0.5, 0.5]]))
    shutil.copytree(FIXTURES / "saelens_jumprelu", tmp_path / "log")
    weights = load_file(FIXTURES / "saelens_jumprelu" / "sae_weights.safetensors")
    weights["log_threshold"] = weights.pop("threshold").log()
    save_file(weights, tmp_path / "log" / "sae_weights.safetensors")
    sae = load_saelens(tmp_path / "log")
    assert torch.allclose(sae(torch.tensor([[1.0, 0.3, 2.0, -1.0]])).x_hat, torch.tensor([[2.0, 2.3, 1.0, -0.3]]))
