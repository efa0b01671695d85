"""The absorption eval on a tiny model: its alphabetic vocabulary, the ICL prompts and their
read position, and the SAEBench layout of a result that (few letters in a tiny vocabulary)
refuses to score."""

import numpy as np
import pytest

from sae_atlas.saes.eval.absorption import (
    AbsorptionConfig,
    alphabetic_words,
    icl_prompt,
    split_prompts,
    word_activations,
)
from sae_atlas.saes.eval.results import read_result
from sae_atlas.saes.eval.suite import EVALS, run_suite
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from sae_atlas.saes.models import tiny_model

    root = tmp_path_factory.mktemp("atlas")
    handle = tiny_model(n_layers=2, d_model=32, seed=3)
    sae = build_sae(SAEConfig("topk", d_in=32, d_sae=64, k=4, hook_name=HOOK))
    save_saelens(sae, AtlasLayout(root).sae_dir("s"))
    return root, handle, sae


def test_the_vocabulary_is_the_alphabetic_single_tokens(tiny):
    _, handle, _ = tiny
    words = alphabetic_words(handle.tokenizer)
    names = [word for word, _ in words]
    assert {"cat", "monday", "january"} <= set(names)
    assert not {"<s>", ".", "0", "let's"} & set(names)
    assert all(handle.tokenizer.convert_ids_to_tokens(token_id) == word for word, token_id in words)


def test_prompts_are_saebench_icl_prompts_from_the_words_own_split():
    assert icl_prompt(" cat", [" dog", " Apple"], "{word} has the first letter:") == (
        " dog has the first letter: D\n Apple has the first letter: A\n cat has the first letter:")
    words = [f"w{i}" for i in range(20)]
    prompts = split_prompts(words, AbsorptionConfig(max_icl_examples=3, test_frac=0.25))
    for word, prompt in zip(words, prompts, strict=True):
        lines = prompt.split("\n")
        assert len(lines) == 4 and lines[-1] == f"{word} has the first letter:"
        assert word not in [line.split(" ")[0] for line in lines[:-1]]


def test_the_read_position_is_the_words_token(tiny):
    _, handle, sae = tiny
    words = alphabetic_words(handle.tokenizer)[:6]
    config = AbsorptionConfig(max_icl_examples=2, batch_size=4)
    prompts = split_prompts([word for word, _ in words], config)
    acts, codes, found = word_activations(handle, sae, HOOK, prompts, [token_id for _, token_id in words], config)
    assert found.all() and acts.shape == (6, 32) and codes.shape == (6, 64)
    # a template whose suffix the reader miscounts would not land on the word
    shifted = AbsorptionConfig(prompt_template="{word}", max_icl_examples=2, batch_size=4)
    _, _, found_shifted = word_activations(handle, sae, HOOK, [p + " cat" for p in prompts],
                                           [token_id for _, token_id in words], shifted)
    assert not found_shifted.any()


def test_absorption_on_a_tiny_vocabulary_refuses_to_score_in_saebench_layout(tiny):
    root, handle, _ = tiny
    assert "absorption" in EVALS
    done = run_suite(root, ["s"], ["absorption"], {"absorption": AbsorptionConfig(max_k_value=3)}, device="cpu",
                     model=lambda: handle, progress=False)
    assert not done.failures, done.failures
    output = read_result(root, "s", "absorption")
    assert output["eval_type_id"] == "absorption_first_letter"
    assert output["eval_result_metrics"] == {"mean": {
        "mean_absorption_fraction_score": None, "mean_full_absorption_score": None, "mean_num_split_features": None,
        "std_dev_absorption_fraction_score": None, "std_dev_full_absorption_score": None,
        "std_dev_num_split_features": None}}
    unstructured = output["eval_result_unstructured"]
    good = sum(f1 > 0.6 for f1 in unstructured["probe_f1"].values())
    assert good < 20 and unstructured["not_scored"].startswith(f"not scored: {good} first letters")
    assert unstructured["words_without_read_token"] == 0 and unstructured["words"] == len(alphabetic_words(handle.tokenizer))
    assert output["eval_result_details"] == []
    assert all(np.isfinite(f1) for f1 in unstructured["probe_f1"].values())
