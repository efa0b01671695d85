"""Attribution graphs on the real SmolLM2-135M (slow: loads the model): RMSNorm, grouped-query
attention with rotary embeddings and gated MLPs, each MLP replaced by a random TopK
transcoder. Edges equal the measured removal effects (float32). (That ablating a graph's top
nodes moves the target more than density-matched random features is measured on the demo
atlas's trained SAEs by `bench/graph_build.py`; random transcoders have no such ranking.)"""

from __future__ import annotations

import pytest
import torch

from sae_atlas.saes.circuits.adjacency import build_graph
from sae_atlas.saes.circuits.perturb import node_values
from sae_atlas.saes.models import load_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig

pytestmark = pytest.mark.slow

PROMPT = "Today is Monday, so tomorrow is"


@pytest.fixture(scope="module")
def graph():
    handle = load_model("smollm2-135m")
    saes = {}
    for layer in range(handle.n_layers):
        cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=256, k=4, seed=layer,
                        hook_name=f"blocks.{layer}.hook_resid_mid", hook_name_out=f"blocks.{layer}.hook_mlp_out",
                        apply_b_dec_to_input=False)
        saes[f"tc{layer}"] = build_sae(cfg)
    tokens = handle.to_tokens(PROMPT)[0]
    return handle, build_graph(handle, saes, tokens, max_logits=1, batch_size=128)


def test_edges_are_measured_effects_on_smollm2(graph):
    handle, g = graph
    gen = torch.Generator().manual_seed(0)
    sources = torch.randperm(g.logit_slice.start, generator=gen)[:40]
    scale = torch.ones(len(sources) + 1, g.n_nodes)
    scale[torch.arange(len(sources)), sources] = 0
    vals = node_values(handle, g, scale)
    rows = torch.cat([torch.arange(g.n_features), torch.arange(g.logit_slice.start, g.n_nodes)])
    measured = (vals[-1][None, rows] - vals[:-1][:, rows]).T
    expected = g.adjacency[rows][:, sources]
    assert expected.abs().max() > 0.1
    assert torch.allclose(expected, measured, atol=1e-3 * float(expected.abs().max()), rtol=1e-3)

