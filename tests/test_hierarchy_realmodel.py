"""Hierarchy on the real SmolLM2-135M unembedding with the curated concept tree."""

import pytest
from threadpoolctl import threadpool_limits


@pytest.mark.slow
def test_smollm2_parent_child_orthogonality():
    from sae_atlas.api.analyses.hierarchy import run_hierarchy
    from sae_atlas.saes.models import load_model

    handle = load_model("smollm2-135m")
    with threadpool_limits(1):
        report = run_hierarchy(handle.W_U, handle.tokenizer, tree="curated", metric="causal", estimator="lda")
    s = report.result.summary
    assert report.params["n_concepts"] >= 25 and s["n_edges"] >= 24
    # " dog" is one token with its leading space in SmolLM2's BPE
    assert handle.tokenizer.encode(" dog", add_special_tokens=False) == [report.tokenized.word_ids["dog"]]
    assert s["cos_child_parent"]["max_abs"] < 0.15
    assert s["cos_child_parent"]["mean_abs"] < 0.25 * s["cos_random_parent"]["mean_abs"]
    assert s["mean_heldout_projection"] > 0.5 and abs(s["mean_random_projection"]) < 0.05
    assert s["simplex_full_rank_share"] == 1.0
