"""Attribution graphs over a cross-layer transcoder on tiny float64 models: every edge is the
measured effect of removing its source (a feature reaches every later MLP output directly),
an exact CLT of a ReLU model has zero errors and full scores, node edits and bad input."""

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.circuits.adjacency import build_graph
from sae_atlas.saes.circuits.node_interventions import NodeEdit, intervene
from sae_atlas.saes.circuits.perturb import node_values
from sae_atlas.saes.circuits.prune import scores
from tests.saes.graph_fixtures import (
    PROMPT,
    exact_clt,
    random_clt,
    random_transcoders,
    removal_effects,
    residual_saes,
    target_rows,
    tiny_f64,
)
from tests.saes.planted import one_thread  # noqa: F401


@pytest.fixture(scope="module")
def gpt2():
    return tiny_f64("gpt2", n_layers=3)


@pytest.fixture(scope="module")
def llama():
    return tiny_f64("llama", n_layers=3)


@pytest.mark.parametrize("case", ["topk", "jumprelu", "llama"])
def test_every_edge_is_the_measured_direct_effect(case, gpt2, llama):
    handle = llama if case == "llama" else gpt2
    clt = random_clt(handle, architecture="jumprelu" if case == "jumprelu" else "topk",
                     read="ln2.hook_normalized" if case == "jumprelu" else "hook_resid_mid")
    g = build_graph(handle, {"clt": clt}, handle.to_tokens(PROMPT)[0], batch_size=32)
    assert g.kind == "clt" and g.linear and g.dictionaries == ["clt@0", "clt@1", "clt@2"]
    assert g.n_features > 20 and set(g.features.dictionary.tolist()) == {0, 1, 2}
    measured, clean = removal_effects(handle, g)
    rows = target_rows(g)
    A = g.adjacency[rows][:, : g.logit_slice.start]
    assert A.abs().max() > 0.1
    assert torch.allclose(A, measured, atol=1e-6, rtol=0)
    assert torch.allclose(clean[rows], g.values[rows], atol=1e-9)
    off = torch.zeros(1, g.n_nodes, dtype=torch.float64)
    const = node_values(handle, g, off)[0]
    assert torch.allclose(g.adjacency[rows].sum(1) + const[rows], g.values[rows], atol=1e-9)
    # what the replacement writes at each MLP output is the CLT's own output there
    _, cap = g.replacement
    x_TLD = torch.stack([cap.x_in[f"clt@{layer}"] for layer in range(3)], dim=1)
    written = torch.stack([cap.out[f"clt@{layer}"] - cap.errors[f"clt@{layer}"] for layer in range(3)], dim=1)
    assert torch.allclose(written[g.start:], clt(x_TLD).x_hat[g.start:], atol=1e-12)
    f = g.features
    later = (f.dictionary[:, None] <= f.dictionary[None]) | (f.pos[:, None] < f.pos[None])
    assert g.adjacency[: g.n_features, : g.n_features][later].abs().max() == 0
    with torch.no_grad():
        diagonal_only = random_clt(handle, architecture=clt.cfg.architecture, read=clt.cfg.input_site)
        for w in diagonal_only.W_dec:
            w[:, 1:] = 0
    g_diag = build_graph(handle, {"clt": diagonal_only}, handle.to_tokens(PROMPT)[0], batch_size=32)
    # the decoders to later layers carry edges of their own: without them the logit edges change
    assert not torch.allclose(g.adjacency[g.logit_slice], g_diag.adjacency[g_diag.logit_slice])


def test_exact_clt_has_zero_errors_and_full_scores(gpt2):
    tokens = gpt2.to_tokens(PROMPT)[0]
    g = build_graph(gpt2, {"exact": exact_clt(gpt2)}, tokens)
    _, cap = g.replacement
    assert max(float(e.abs().max()) for e in cap.errors.values()) < 1e-12
    assert g.adjacency[:, g.error_slice].abs().max() < 1e-12
    s = scores(g)
    assert s.replacement == pytest.approx(1.0, abs=1e-9) and s.completeness == pytest.approx(1.0, abs=1e-9)
    noisy = scores(build_graph(gpt2, {"clt": random_clt(gpt2)}, tokens))
    assert noisy.replacement < 0.99 and noisy.completeness < 0.99


def test_node_edits_in_the_clt_replacement_model(gpt2):
    g = build_graph(gpt2, {"clt": random_clt(gpt2)}, gpt2.to_tokens(PROMPT)[0])
    f = g.features
    first = int(((f.dictionary == 0) & (f.pos == g.n_pos - 1)).nonzero()[0, 0])
    edit = NodeEdit(kind="ablate", nodes=[first])
    frozen = intervene(gpt2, g, [edit], recompute=False)
    # with every other feature fixed, removing one changes the logits by its direct edges
    assert torch.allclose(torch.tensor(frozen.measured), torch.tensor(frozen.direct), atol=1e-9)


def test_a_clt_over_the_first_layers_with_the_rest_frozen_or_transcoded(gpt2):
    """A CLT over layers 0-1 of a 3-layer model: the last MLP frozen (its output an error
    node) or replaced by a per-layer transcoder; the graph stays exact."""
    tokens = gpt2.to_tokens(PROMPT)[0]
    short = random_clt(tiny_f64("gpt2", n_layers=2))
    with pytest.raises(InvalidInputError, match=r"no transcoder for the MLPs of layers \[2\].*freeze the others"):
        build_graph(gpt2, {"clt": short}, tokens)
    frozen = build_graph(gpt2, {"clt": short}, tokens, freeze_mlps=True)
    plt = build_graph(gpt2, {"clt": short, "tc2": random_transcoders(gpt2)["tc2"]}, tokens)
    assert frozen.dictionaries == ["clt@0", "clt@1", "mlp2-frozen"] and plt.dictionaries == ["clt@0", "clt@1", "tc2"]
    for g in (frozen, plt):
        assert g.kind == "clt" and g.linear
        measured, _ = removal_effects(gpt2, g)
        assert torch.allclose(g.adjacency[target_rows(g)][:, : g.logit_slice.start], measured, atol=1e-6, rtol=0)
    assert int((frozen.features.dictionary == 2).sum()) == 0 and int((plt.features.dictionary == 2).sum()) > 0


def test_clts_the_graph_cannot_use(gpt2):
    tokens = gpt2.to_tokens(PROMPT)[0]
    with pytest.raises(InvalidInputError, match="spans 4 layers"):
        build_graph(gpt2, {"clt": random_clt(tiny_f64("gpt2", n_layers=4))}, tokens)
    with pytest.raises(InvalidInputError, match="'clt@0' and transcoder 'tc0' both replace the MLP of layer 0"):
        build_graph(gpt2, {"clt": random_clt(gpt2), **random_transcoders(gpt2)}, tokens)
    with pytest.raises(InvalidInputError, match="one cross-layer transcoder"):
        build_graph(gpt2, {"a": random_clt(gpt2), "b": random_clt(gpt2)}, tokens)
    with pytest.raises(InvalidInputError, match="not SAEs"):
        build_graph(gpt2, {"a": random_clt(gpt2), **residual_saes(gpt2, ["blocks.0.hook_resid_post"])}, tokens)
    with pytest.raises(InvalidInputError, match="from the MLPs' inputs"):
        build_graph(gpt2, {"clt": random_clt(gpt2, read="hook_resid_pre")}, tokens)
