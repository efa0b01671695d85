"""Attribution graphs on tiny float64 models: every edge is the measured effect of removing
its source (attention and norms frozen), completeness, batching, targets and bad input."""

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.circuits.adjacency import build_graph
from sae_atlas.saes.circuits.perturb import node_values
from sae_atlas.saes.circuits.prune import scores
from tests.saes.graph_fixtures import (
    PROMPT,
    exact_transcoders,
    random_transcoders,
    removal_effects,
    residual_saes,
    target_rows,
    tiny_f64,
)
from tests.saes.planted import one_thread  # noqa: F401


@pytest.fixture(scope="module")
def gpt2():
    return tiny_f64("gpt2")


@pytest.fixture(scope="module")
def llama():
    return tiny_f64("llama")


@pytest.mark.parametrize("case", ["exact", "skip", "llama"])
def test_every_edge_is_the_measured_direct_effect(case, gpt2, llama):
    handle = llama if case == "llama" else gpt2
    saes = exact_transcoders(handle) if case == "exact" else random_transcoders(handle)
    g = build_graph(handle, saes, handle.to_tokens(PROMPT)[0], batch_size=32)
    assert g.linear and g.kind == "transcoders" and g.n_features > 20
    measured, clean = removal_effects(handle, g)
    rows = target_rows(g)
    A = g.adjacency[rows][:, : g.logit_slice.start]
    assert A.abs().max() > 0.1
    assert torch.allclose(A, measured, atol=1e-6, rtol=0)
    assert torch.allclose(clean[rows], g.values[rows], atol=1e-9)
    # completeness: each row's edges plus the constant left with every source removed is its value
    off = torch.zeros(1, g.n_nodes, dtype=torch.float64)
    const = node_values(handle, g, off)[0]
    assert torch.allclose(g.adjacency[rows].sum(1) + const[rows], g.values[rows], atol=1e-9)
    # nothing flows from a later layer or from a later position
    f = g.features
    later = (f.dictionary[:, None] <= f.dictionary[None]) | (f.pos[:, None] < f.pos[None])
    assert g.adjacency[: g.n_features, : g.n_features][later].abs().max() == 0


def test_frozen_mlps_stand_in_for_missing_transcoders(gpt2):
    tokens = gpt2.to_tokens(PROMPT)[0]
    exact = exact_transcoders(gpt2)
    with pytest.raises(InvalidInputError, match="freeze the others"):
        build_graph(gpt2, {"tc0": exact["tc0"]}, tokens)
    g = build_graph(gpt2, {"tc0": exact["tc0"]}, tokens, freeze_mlps=True)
    assert g.dictionaries == ["tc0", "mlp1-frozen"] and g.linear
    assert int((g.features.dictionary == 1).sum()) == 0  # the frozen MLP has no features
    _, cap = g.replacement
    assert torch.allclose(cap.errors["mlp1-frozen"][g.start:], cap.out["mlp1-frozen"][g.start:])
    measured, _ = removal_effects(gpt2, g)
    assert torch.allclose(g.adjacency[target_rows(g)][:, : g.logit_slice.start], measured, atol=1e-6, rtol=0)
    s = scores(g)
    assert s.replacement < 0.99 and s.completeness < 0.99


def test_exact_transcoders_have_zero_errors_and_full_scores(gpt2):
    tokens = gpt2.to_tokens(PROMPT)[0]
    g = build_graph(gpt2, exact_transcoders(gpt2), tokens)
    _, cap = g.replacement
    assert max(float(e.abs().max()) for e in cap.errors.values()) < 1e-12
    assert g.adjacency[:, g.error_slice].abs().max() < 1e-12
    s = scores(g)
    assert s.replacement == pytest.approx(1.0, abs=1e-9) and s.completeness == pytest.approx(1.0, abs=1e-9)
    noisy = scores(build_graph(gpt2, random_transcoders(gpt2), tokens))
    assert noisy.replacement < 0.99 and noisy.completeness < 0.99


def test_residual_sae_edges_are_first_order(gpt2):
    saes = residual_saes(gpt2, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"])
    g = build_graph(gpt2, saes, gpt2.to_tokens(PROMPT)[0], batch_size=16)
    assert g.kind == "residual" and not g.linear
    src, rows, eps = torch.arange(g.logit_slice.start), target_rows(g), 1e-5
    up = torch.ones(len(src), g.n_nodes, dtype=torch.float64)
    down = up.clone()
    up[torch.arange(len(src)), src] += eps
    down[torch.arange(len(src)), src] -= eps
    slope = ((node_values(gpt2, g, up) - node_values(gpt2, g, down))[:, rows] / (2 * eps)).T
    assert g.adjacency[rows][:, src].abs().max() > 0.01
    assert torch.allclose(g.adjacency[rows][:, src], slope, atol=1e-6, rtol=0)
    # the stream is cut at every SAE: the first SAE's features reach the logits only through the second
    first = (g.features.dictionary == 0).nonzero()[:, 0]
    assert g.adjacency[g.logit_slice][:, first].abs().max() == 0


def test_batch_size_does_not_change_the_graph(gpt2):
    tokens = gpt2.to_tokens(PROMPT)[0]
    saes = random_transcoders(gpt2)
    a = build_graph(gpt2, saes, tokens, batch_size=5)
    b = build_graph(gpt2, saes, tokens, batch_size=64)
    assert a.settings["backward_passes"] > b.settings["backward_passes"]
    assert torch.allclose(a.adjacency, b.adjacency, atol=1e-12)


def test_logit_targets(gpt2):
    tokens = gpt2.to_tokens(PROMPT)[0]
    saes = random_transcoders(gpt2)
    g = build_graph(gpt2, saes, tokens, targets=["tuesday", "cat"])
    assert g.logits.tokens == ["tuesday", "cat"]
    logits = g.replacement[1].logits_TV[-1]
    ids = g.logits.ids
    # a logit node's value is the token's logit minus the mean logit (unembedding bias left out)
    b_U = gpt2.bridge.b_U.detach()
    assert torch.allclose(g.values[g.logit_slice], (logits - b_U)[ids] - (logits - b_U).mean(), atol=1e-9)
    top = build_graph(gpt2, saes, tokens, max_logits=3, cumulative_prob=1.0)
    assert len(top.logits.ids) == 3 and top.logits.ids[0] == int(logits.argmax())
    with pytest.raises(InvalidInputError, match="not in the model's vocabulary"):
        build_graph(gpt2, saes, tokens, targets=["zebra"])
    with pytest.raises(InvalidInputError, match="2 tokens"):
        build_graph(gpt2, saes, tokens, targets=["the cat"])


def test_dictionaries_the_graph_cannot_use(gpt2):
    tokens = gpt2.to_tokens(PROMPT)[0]
    tcs = random_transcoders(gpt2)
    with pytest.raises(InvalidInputError, match=r"no transcoder for the MLPs of layers \[1\]"):
        build_graph(gpt2, {"tc0": tcs["tc0"]}, tokens)
    for hook in ("blocks.0.hook_mlp_out", "blocks.1.hook_resid_mid"):
        with pytest.raises(InvalidInputError, match="a graph cannot use"):
            build_graph(gpt2, residual_saes(gpt2, [hook]), tokens)
    mixed = {**tcs, **residual_saes(gpt2, ["blocks.0.hook_resid_post"])}
    with pytest.raises(InvalidInputError, match="not both"):
        build_graph(gpt2, mixed, tokens)
    with pytest.raises(InvalidInputError, match="none were given"):
        build_graph(gpt2, {}, tokens)
