"""Every import layout, read from hand-made fixtures (tests/fixtures/make_import_fixtures.py),
gives the encode / decode of a reference computation written here from the format's docs;
the registry resolves through an offline Hugging Face cache built by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sae_atlas.errors import (
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    UnknownHookError,
)
from sae_atlas.saes.formats import detect_layout, load_any
from sae_atlas.saes.formats.foreign_hooks import to_atlas_hook
from sae_atlas.saes.importing.origins import HFPath, registry_entry, resolve_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMPORT = FIXTURES / "import"
GEMMA = IMPORT / "gemma-scope-tiny-res" / "layer_1" / "width_6" / "average_l0_2"
LLAMA = IMPORT / "llama_scope" / "Tiny-L1R-8x"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return 2.0 * torch.randn(64, 4, generator=torch.Generator().manual_seed(0))


def _check(sae, x: torch.Tensor, f_ref: torch.Tensor, x_hat_ref: torch.Tensor) -> None:
    out = sae(x)
    assert (f_ref != 0).any() and (f_ref == 0).any()  # the fixture exercises both sides of the code
    torch.testing.assert_close(out.feature_acts, f_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.x_hat, x_hat_ref, atol=1e-5, rtol=1e-5)


def _topk(acts: torch.Tensor, k: int) -> torch.Tensor:
    top = acts.topk(k, dim=-1)
    return torch.zeros_like(acts).scatter(-1, top.indices, top.values)


def test_gemma_scope(x: torch.Tensor) -> None:
    p = {k: torch.from_numpy(v) for k, v in np.load(GEMMA / "params.npz").items()}
    pre = x @ p["W_enc"] + p["b_enc"]  # no b_dec on the input
    f = pre * (pre > p["threshold"])
    sae = load_any(GEMMA)
    assert detect_layout(GEMMA) == "gemma_scope"
    assert (sae.cfg.architecture, sae.cfg.hook_name, sae.cfg.apply_b_dec_to_input) == (
        "jumprelu", "blocks.1.hook_resid_post", False)
    _check(sae, x, f, f @ p["W_dec"] + p["b_dec"])


def test_llama_scope_folds_dataset_norm(x: torch.Tensor) -> None:
    hp = json.loads((LLAMA / "hyperparams.json").read_text())
    t = load_file(str(LLAMA / "checkpoints" / "final.safetensors"))
    s = hp["d_model"] ** 0.5 / hp["dataset_average_activation_norm"]["in"]
    pre = (s * x) @ t["encoder.weight"].T + t["encoder.bias"]
    f = pre * (pre > hp["jump_relu_threshold"] * s)
    x_hat = (f @ t["decoder.weight"].T + t["decoder.bias"]) / s
    sae = load_any(LLAMA)
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post" and not sae.cfg.apply_b_dec_to_input
    _check(sae, x, f, x_hat)


@pytest.mark.parametrize("name", ["dictionary_learning_batchtopk", "dictionary_learning_topk"])
def test_dictionary_learning_topk_and_batchtopk(x: torch.Tensor, name: str) -> None:
    folder = IMPORT / name
    ae = torch.load(folder / "ae.pt", weights_only=True)
    acts = ((x - ae["b_dec"]) @ ae["encoder.weight"].T + ae["encoder.bias"]).relu()
    if name.endswith("batchtopk"):  # inference: relu(pre) kept above the learned threshold
        f = acts * (acts > ae["threshold"])
    else:
        f = _topk(acts, int(ae["k"]))
    sae = load_any(folder)
    assert sae.cfg.architecture == ("batchtopk" if name.endswith("batchtopk") else "topk")
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post"
    if name.endswith("batchtopk"):
        assert torch.all(sae.threshold == ae["threshold"])  # the threshold survives
    _check(sae, x, f, f @ ae["decoder.weight"].T + ae["b_dec"])


def test_sparsify(x: torch.Tensor) -> None:
    folder = IMPORT / "sparsify_tiny" / "layers.1"
    t = load_file(str(folder / "sae.safetensors"))
    f = _topk(((x - t["b_dec"]) @ t["encoder.weight"].T + t["encoder.bias"]).relu(), 2)
    sae = load_any(folder)
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post"
    _check(sae, x, f, f @ t["W_dec"] + t["b_dec"])


def test_saelens_expected_average_only_in_needs_and_folds_a_scale(x: torch.Tensor) -> None:
    folder = IMPORT / "saelens_norm"
    with pytest.raises(InvalidInputError, match="norm_scaling_factor"):
        load_any(folder)
    t = load_file(str(folder / "sae_weights.safetensors"))
    s = 2.0
    f = ((s * x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]).relu()
    _check(load_any(folder, norm_scaling_factor=s), x, f, (f @ t["W_dec"] + t["b_dec"]) / s)


@pytest.mark.parametrize("name", ["saelens_topk", "saelens_jumprelu", "saelens_legacy"])
def test_saelens_layouts(x: torch.Tensor, name: str) -> None:
    folder = FIXTURES / name
    cfg = json.loads((folder / "cfg.json").read_text())
    t = load_file(str(folder / "sae_weights.safetensors"))
    x = x + 1.0  # shift so that some latents fire in every fixture
    pre = (x - t["b_dec"] * cfg.get("apply_b_dec_to_input", True)) @ t["W_enc"] + t["b_enc"]
    if "threshold" in t:
        f = pre * (pre > t["threshold"])
    elif cfg.get("architecture") == "topk":
        f = _topk(pre.relu(), cfg["k"])
    elif cfg.get("activation_fn_str") == "topk":
        f = _topk(pre.relu(), cfg["activation_fn_kwargs"]["k"])
    else:
        f = pre.relu()
    W_dec = t["W_dec"] * t["scaling_factor"][:, None] if "scaling_factor" in t else t["W_dec"]
    _check(load_any(folder), x, f, f @ W_dec + t["b_dec"])


def test_transposed_weights_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    shutil.copytree(FIXTURES / "saelens_jumprelu", folder)
    t = load_file(str(folder / "sae_weights.safetensors"))
    from safetensors.torch import save_file

    save_file({**t, "W_enc": t["W_dec"].contiguous(), "W_dec": t["W_enc"].contiguous()}, folder / "sae_weights.safetensors")
    with pytest.raises(IntegrityError, match="transposed"):
        load_any(folder)


def test_hook_names_map_to_transformerlens() -> None:
    valid = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "blocks.1.hook_mlp_out"]
    assert to_atlas_hook("model.layers.1", valid) == "blocks.1.hook_resid_post"
    assert to_atlas_hook("layers.1.mlp", valid) == "blocks.1.hook_mlp_out"
    assert to_atlas_hook("blocks.1.hook_resid_pre", valid) == "blocks.0.hook_resid_post"
    assert to_atlas_hook("hidden_states.0", valid) == "blocks.0.hook_resid_pre"
    assert to_atlas_hook("hidden_states.2", valid) == "blocks.1.hook_resid_post"
    with pytest.raises(UnknownHookError, match=r"blocks.7.hook_resid_post.*valid hooks: .*blocks\.\{0\.\.1\}"):
        to_atlas_hook("blocks.7.hook_resid_post", valid)


def hf_cache(root: Path) -> Path:
    """A Hugging Face hub cache holding the fixture folders as repo sae-atlas/fixtures."""
    repo = root / "models--sae-atlas--fixtures"
    shutil.copytree(IMPORT, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return root


@pytest.fixture()
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    cache = hf_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_registry_and_hf_paths_resolve_offline(offline_hub: Path, x: torch.Tensor) -> None:
    resolved = resolve_source("sae-atlas-fixtures/gemma-scope-layer-1")
    assert resolved.kind == "registry" and resolved.provenance["revision"] == COMMIT
    assert resolved.expected_l0 == 2.0
    torch.testing.assert_close(load_any(resolved.folder)(x).x_hat, load_any(GEMMA)(x).x_hat)
    norm = resolve_source("sae-atlas-fixtures/saelens-norm")
    assert norm.norm_scaling_factor == 2.0
    hf = resolve_source(f"hf://sae-atlas/fixtures/llama_scope/Tiny-L1R-8x@{COMMIT}")
    assert hf.kind == "hf" and hf.provenance["repo_id"] == "sae-atlas/fixtures"
    assert detect_layout(hf.folder) == "llama_scope"
    with pytest.raises(NotFoundError, match="HF_HUB_OFFLINE"):
        resolve_source("hf://sae-atlas/not-cached/x")


def test_registry_errors_list_what_is_valid(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="releases in .*sae-atlas-fixtures"):
        registry_entry("no-such-release/x")
    with pytest.raises(NotFoundError, match="valid: gemma-scope-layer-1"):
        registry_entry("sae-atlas-fixtures/nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(InvalidInputError, match="mapping of releases"):
        registry_entry("a/b", bad)
    assert HFPath.parse("hf://org/repo/a/b@v1") == HFPath("org/repo", "a/b", "v1")
    with pytest.raises(InvalidInputError):
        HFPath.parse("hf://org")


def test_per_token_normalisation_is_refused_with_its_reason(tmp_path: Path) -> None:
    for mode in ("constant_norm_rescale", "layer_norm"):
        folder = tmp_path / mode
        shutil.copytree(IMPORT / "saelens_norm", folder)
        cfg = json.loads((folder / "cfg.json").read_text())
        (folder / "cfg.json").write_text(json.dumps({**cfg, "normalize_activations": mode}))
        with pytest.raises(InvalidInputError, match=f"{mode}.*cannot be folded"):
            load_any(folder, norm_scaling_factor=1.0)


def test_gemma_scope_sites_and_embedding_scale(tmp_path: Path, x: torch.Tensor) -> None:
    from sae_atlas.saes.formats.gemma_scope import gemma_scope_hook

    for site, hook in (("res", "blocks.3.hook_resid_post"), ("mlp", "blocks.3.hook_mlp_out"),
                       ("att", "blocks.3.attn.hook_z")):
        folder = tmp_path / f"gemma-scope-2b-pt-{site}" / "layer_3" / "width_16k" / "average_l0_5"
        folder.mkdir(parents=True)
        assert gemma_scope_hook(folder) == hook
    embedding = tmp_path / "gemma-scope-2b-pt-res" / "embedding" / "width_4k" / "average_l0_6"
    shutil.copytree(GEMMA, embedding)
    p = {k: torch.from_numpy(v) for k, v in np.load(GEMMA / "params.npz").items()}
    sae = load_any(embedding)  # trained on embeddings scaled by sqrt(d_model)
    assert sae.cfg.hook_name == "hook_embed"
    pre = x @ (p["W_enc"] / 2.0) + p["b_enc"]
    f = pre * (pre > p["threshold"])
    _check(sae, x, f, f @ (p["W_dec"] * 2.0) + p["b_dec"])


def test_llama_scope_transcoder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "tc"
    shutil.copytree(LLAMA, folder)
    hp = json.loads((folder / "hyperparams.json").read_text())
    hp["hook_point_in"] = "blocks.1.ln2.hook_normalized"
    (folder / "hyperparams.json").write_text(json.dumps(hp))
    with pytest.raises(InvalidInputError, match="transcoder"):
        load_any(folder)
