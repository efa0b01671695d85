"""Model loading: tiny models from a config, hook checks, the embedded default (slow)."""

import pytest
import torch

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.models import load_model, tiny_model


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tiny_model_handle(arch):
    handle = tiny_model(arch=arch, n_layers=3, d_model=16)
    assert (handle.n_layers, handle.d_model) == (3, 16)
    assert handle.W_U.shape == (16, handle.d_vocab)
    assert "blocks.2.hook_resid_post" in handle.hook_names
    assert handle.hook_layer("blocks.2.hook_resid_post") == 2
    assert handle.final_norm_kind == ("rms" if arch == "llama" else "layer")
    tokens = handle.to_tokens("the cat sat on the mat")
    assert tokens[0, 0].item() == handle.bos_token_id


def test_tiny_model_is_seeded():
    a, b, c = tiny_model(seed=1), tiny_model(seed=1), tiny_model(seed=2)
    tokens = a.to_tokens("the dog ran")
    assert torch.equal(a.bridge(tokens), b.bridge(tokens))
    assert not torch.equal(a.bridge(tokens), c.bridge(tokens))


def test_unknown_hook_lists_valid_ones():
    handle = tiny_model(n_layers=2)
    with pytest.raises(UnknownHookError, match=r"blocks.7.hook_resid_post.*blocks.\{0..1\}.hook_resid_post"):
        handle.check_hook("blocks.7.hook_resid_post")


def test_bad_specs_are_clear(tmp_path):
    with pytest.raises(InvalidInputError, match="cannot load model 'nonsense'"):
        load_model("nonsense")
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(InvalidInputError, match="unknown tiny-model keys"):
        load_model({"kind": "tiny", "layers": 3})
    with pytest.raises(InvalidInputError, match="not valid"):
        load_model("{kind: tiny")


def test_local_hf_folder_loads(tmp_path):
    from sae_atlas.saes import models

    tokenizer = models._tiny_tokenizer(models.TINY_WORDS)
    hf = models._tiny_hf_model(models.TinyModelSpec(n_layers=2, seed=5), len(tokenizer))
    tokens = torch.tensor([[1, 3, 20, 40]])
    expected = hf(tokens).logits
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    local = load_model(str(tmp_path), cache=False)
    assert local.n_layers == 2
    assert torch.allclose(local.bridge(tokens), expected, atol=1e-5)


@pytest.mark.slow
def test_embedded_smollm2_completes_weekdays():
    handle = load_model("smollm2-135m")
    assert (handle.n_layers, handle.d_model) == (30, 576)
    tokens = handle.to_tokens("Monday, Tuesday, Wednesday, Thursday,")
    logits = handle.bridge(tokens)
    assert handle.tokenizer.decode(logits[0, -1].argmax()) == " Friday"
