"""Token-by-token features of one text: decoded token strings (' october', never
'Ġoctober') and, per SAE and token, the top-k positive latents of a direct encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sae_atlas.saes.encoding.tokens import TokenFeatureActs, token_features
from sae_atlas.saes.models import ModelHandle, tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig

TEXT = "the cat sat on the mat in october"
HOOKS = {"early": "blocks.0.hook_resid_post", "late": "blocks.1.hook_resid_post"}


def byte_level_tokenizer(folder: Path) -> object:
    """A small byte-level BPE tokenizer (GPT-2 style 'Ġ' pieces) that prepends BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator([TEXT] * 5, trainers.BpeTrainer(vocab_size=60, initial_alphabet=[],
                                                              special_tokens=["<unk>", "<s>", "</s>"]))
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="</s>")
    fast.save_pretrained(folder)  # TransformerLens re-loads a tokenizer from its folder
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture
def handle(tmp_path: Path) -> ModelHandle:
    """A tiny model (not shared with other tests) reading a byte-level BPE tokenizer."""
    handle = tiny_model(n_layers=2, d_model=16, n_heads=2, d_mlp=32, seed=1)
    handle.bridge.tokenizer = byte_level_tokenizer(tmp_path / "tokenizer")
    handle.tokenizer = handle.bridge.tokenizer
    return handle


def saes() -> dict[str, torch.nn.Module]:
    out = {}
    for i, (sae_id, hook) in enumerate(HOOKS.items()):
        sae = build_sae(SAEConfig("topk", d_in=16, d_sae=24, k=4, hook_name=hook, seed=i)).eval()
        with torch.no_grad():
            sae.b_enc.add_(0.3)
        out[sae_id] = sae
    return out


def test_tokens_are_decoded_strings(handle: ModelHandle) -> None:
    result = token_features(handle, saes(), HOOKS, TEXT, k=3)
    assert isinstance(result, TokenFeatureActs)
    assert result.token_ids == handle.to_tokens(TEXT)[0].tolist()
    assert result.token_ids[0] == handle.bos_token_id
    pieces = handle.tokenizer.convert_ids_to_tokens(result.token_ids)
    assert "Ġoctober" in pieces and " october" in result.tokens and "Ġoctober" not in result.tokens
    assert result.tokens == [handle.tokenizer.decode([i]) for i in result.token_ids]
    assert "".join(result.tokens[1:]) == TEXT


def test_features_are_the_top_k_positive_latents_of_each_token(handle: ModelHandle) -> None:
    models = saes()
    k = 3
    result = token_features(handle, models, HOOKS, TEXT, k=k)
    assert list(result.features) == list(HOOKS)
    tokens = handle.to_tokens(TEXT)
    _, cache = handle.bridge.run_with_cache(tokens)
    for sae_id, hook in HOOKS.items():
        with torch.no_grad():
            f_TF = models[sae_id].encode(cache[hook][0].float())
        per_token = result.features[sae_id]
        assert len(per_token) == tokens.shape[1]
        for row, top in zip(f_TF, per_token, strict=True):
            values, latents = row.topk(k)
            expected = [(int(i), float(a)) for a, i in zip(values, latents, strict=True) if a > 0]
            assert [t["latent"] for t in top] == [i for i, _ in expected]
            assert [t["act"] for t in top] == pytest.approx([a for _, a in expected], rel=1e-5, abs=1e-6)
        assert sum(len(top) for top in per_token) > 0
        assert all(isinstance(t["latent"], int) and isinstance(t["act"], float) and t["act"] > 0
                   for top in per_token for t in top)


def test_a_k_above_the_width_keeps_every_firing_latent(handle: ModelHandle) -> None:
    result = token_features(handle, {"early": saes()["early"]}, HOOKS, TEXT, k=100)
    assert all(len(top) <= 24 for top in result.features["early"]) and set(result.features) == {"early"}
