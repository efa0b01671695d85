"""Transcoder features are summarized, searched and shown like SAE features: activations
come from the hook the transcoder reads, logit effects from its decoder in the space it
writes, and its facts and feature pages name both hooks."""

from __future__ import annotations

import pytest
import torch

from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.importing.pipeline import import_sae
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.summary.run import summarize_sae
from sae_atlas.store.activations import ActivationReader
from tests.saes.planted import one_thread  # noqa: F401
from tests.saes.test_transcoder_import import _exact_set

HOOK_IN, HOOK_OUT = "blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tc-pages")
    handle = tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)
    root = tmp / "atlas"
    cache_activations(handle, root, [HOOK_IN, HOOK_OUT], corpus=CorpusSpec(context_size=16), n_tokens=16 * 120,
                      progress=False)
    result = import_sae(root, _exact_set(tmp / "set", handle), model_handle=handle, with_model=False)
    summarize_sae(root, result.sae_id, W_U=handle.W_U, final_norm_weight=handle.final_norm_weight,
                  norm_kind=handle.final_norm_kind, tokenizer=handle.tokenizer)
    return root, handle, result.sae_id


def test_summary_reads_the_input_hook(imported):
    from sae_atlas import Atlas

    root, handle, sae_id = imported
    mlp = handle.bridge.blocks[1].mlp
    held = torch.cat([r.acts for r in ActivationReader(root, HOOK_IN).rows("heldout")])
    neurons = (held @ mlp.W_in.detach() + mlp.b_in.detach()).relu()  # the exact transcoder's code is the MLP's neurons
    atlas = Atlas(root, model=handle)
    for latent in (0, 7):
        page = atlas.feature(sae_id, latent)
        assert page.hook == HOOK_IN and page.hook_out == HOOK_OUT
        assert page.stats["max_act"] == pytest.approx(float(neurons[:, latent].max()), rel=1e-4)
        assert page.top_logits  # decoder rows [d_sae, d_out] read through the unembedding
    info = atlas.sae_info(sae_id)
    assert (info["hook"], info["hook_out"]) == (HOOK_IN, HOOK_OUT)


def test_sae_listing_over_http_names_both_hooks(imported):
    from fastapi.testclient import TestClient

    from sae_atlas.api.http.app import create_app
    from sae_atlas.api.http.settings import ServerSettings

    root, _, sae_id = imported
    with TestClient(create_app(ServerSettings(root=root))) as client:
        info = client.get(f"/saes/{sae_id}").json()
        assert (info["hook"], info["hook_out"]) == (HOOK_IN, HOOK_OUT)
        page = client.get(f"/saes/{sae_id}/features/3").json()
        assert (page["hook"], page["hook_out"]) == (HOOK_IN, HOOK_OUT)
        listing = {row["sae_id"]: row for row in client.get("/saes").json()}
        assert listing[sae_id]["hook_out"] == HOOK_OUT


def test_output_scores_steer_where_the_transcoder_writes(imported):
    from sae_atlas.saes.intervene.output_scores import SteeringParams, compute_steering_scores
    from sae_atlas.store.steering import read_steering

    root, handle, sae_id = imported
    compute_steering_scores(handle, root, sae_id, SteeringParams(n_prompts=2, prompt_tokens=6, chunk=16),
                            progress=False)
    table, meta = read_steering(root, sae_id)
    assert meta["params"]["hook"] == HOOK_OUT and table.height == 32
