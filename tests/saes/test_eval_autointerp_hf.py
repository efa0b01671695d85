"""The in-process `hf` autointerp back-end on a tiny random Llama built from a config: it
explains and judges the planted latents end to end and returns well-formed scores (a
random model's explanations mean nothing; its judgements are next-token probabilities, so
every AUC is defined), its verdicts follow its logits, and a model that does not load is
refused before any work."""

import json

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.autointerp import AutointerpConfig, autointerp_config, build_backend
from sae_atlas.saes.eval.autointerp_backends import LEXICAL_PROXY
from sae_atlas.saes.eval.autointerp_scoring import Sample
from sae_atlas.saes.eval.suite import run_suite
from tests.saes.test_eval_autointerp import atlas, no_model  # noqa: F401 (the planted atlas fixture)

TINY = json.dumps({"kind": "tiny", "n_layers": 1, "d_model": 32, "context": 512, "seed": 3})


def test_hf_backend_on_a_tiny_random_model_runs_and_returns_well_formed_scores(atlas):  # noqa: F811
    autointerp_config("hf", model=TINY)  # the command line's check loads the model
    config = AutointerpConfig("hf", model=TINY, n_latents=2, n_explain=4, n_activating=4, n_non_activating=4)
    run = run_suite(atlas, ["s"], ["autointerp"], {"autointerp": config}, device="cpu", model=no_model,
                    progress=False)
    assert not run.failures, run.failures
    result = run.results["s"]["autointerp"]
    assert result["eval_config"]["backend"] == "hf" and result["eval_config"]["model"] == TINY
    metrics = result["eval_result_metrics"]
    assert metrics["autointerp"]["backend"] == "LLM tiny-llama in-process" and metrics["autointerp"]["n_latents"] == 2
    assert LEXICAL_PROXY not in json.dumps(result)
    for scorer in ("detection", "fuzzing"):
        scores = metrics[scorer]
        assert 0 <= scores[f"{scorer}_balanced_accuracy"] <= 1 and 0 <= scores[f"{scorer}_f1"] <= 1
        assert scores[f"{scorer}_auc"] is not None and 0 <= scores[f"{scorer}_auc"] <= 1
    for row in result["eval_result_details"]:
        assert isinstance(row["explanation"], str) and "\n" not in row["explanation"]
        assert row["detection_failed"] == 0 and row["fuzzing_failed"] == 0


def test_hf_verdicts_are_the_models_probability_of_one_over_zero():
    backend = build_backend(autointerp_config("hf", model=TINY))
    sample = Sample(("the", "cat", "sat"), (1,), True)
    judgement = backend.judge("detection", "cats", [sample])[0]
    answer_0, answer_1 = backend.tokenizer.convert_tokens_to_ids(["0", "1"])
    model = backend.model

    def favouring_one(ids: torch.Tensor) -> object:
        out = model(ids)
        out.logits[..., answer_1] += 3.0
        return out

    backend.model = favouring_one
    try:
        raised = backend.judge("detection", "cats", [sample])[0]
    finally:
        backend.model = model
    assert answer_0 != answer_1 and 0 < judgement.probability < 1
    odds = lambda p: p / (1 - p)  # noqa: E731
    assert odds(raised.probability) == pytest.approx(odds(judgement.probability) * np.exp(3.0), rel=1e-4)
    assert judgement.prediction == (judgement.probability >= 0.5)


def test_a_model_that_does_not_load_is_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="cannot load"):
        autointerp_config("hf", model=str(tmp_path / "missing.gguf"))
    with pytest.raises(InvalidInputError, match="needs --autointerp-model"):
        autointerp_config("hf")
