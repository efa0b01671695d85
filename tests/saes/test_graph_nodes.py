"""Pruning by influence, circuit-tracer's graph JSON, supernodes and interventions on graph
nodes, on tiny float64 models and planted adjacencies."""

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from sae_atlas.saes.circuits.adjacency import build_graph
from sae_atlas.saes.circuits.export import graph_json, node_ids
from sae_atlas.saes.circuits.graph import FeatureNodes, Graph
from sae_atlas.saes.circuits.node_interventions import NodeEdit, intervene
from sae_atlas.saes.circuits.prune import influence, normalized, prune, scores
from sae_atlas.saes.circuits.supernodes import collapse, supernodes
from sae_atlas.saes.circuits.targets import LogitTargets
from tests.saes.graph_fixtures import PROMPT, exact_transcoders, random_transcoders, tiny_f64
from tests.saes.planted import one_thread  # noqa: F401

SCHEMA = json.loads((Path(__file__).parents[1] / "fixtures/graphs/circuit-tracer-graph.schema.json").read_text())


@pytest.fixture(scope="module")
def gpt2():
    return tiny_f64("gpt2")


@pytest.fixture(scope="module")
def graph(gpt2):
    return build_graph(gpt2, random_transcoders(gpt2), gpt2.to_tokens(PROMPT)[0])


def planted_graph() -> Graph:
    """Two positions, one dictionary, four features: token 1 -> f0 -> f2 -> logit carries
    nearly everything; f1 and f3 hang off it with tiny edges; the error feeds f2 a little."""
    feats = FeatureNodes(torch.tensor([0, 0, 0, 0]), torch.tensor([1, 1, 1, 1]), torch.tensor([5, 6, 7, 8]),
                         torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64))
    # nodes: f0 f1 f2 f3 | err0 err1 | tok0 tok1 | logit
    N = 9
    A = torch.zeros(N, N, dtype=torch.float64)
    A[0, 7] = 5.0    # tok1 -> f0
    A[1, 7] = 0.01   # tok1 -> f1
    A[2, 0] = 4.0    # f0 -> f2
    A[2, 5] = 0.5    # err1 -> f2
    A[3, 1] = 0.01   # f1 -> f3
    A[8, 2] = 3.0    # f2 -> logit
    A[8, 3] = 0.001  # f3 -> logit
    A[8, 6] = 0.2    # tok0 -> logit
    logits = LogitTargets([3], ["x"], torch.tensor([1.0], dtype=torch.float64), torch.zeros(1, 4))
    return Graph("a b", ["a", "b"], [1, 2], "transcoders", ["tc0"], [0], [("r", "w")], feats, logits, A,
                 torch.full((N,), float("nan")), True, 1)


def test_influence_is_the_series_of_the_normalized_adjacency():
    g = planted_graph()
    norm = normalized(g.adjacency)
    w = g.logit_weights()
    closed = w @ (torch.linalg.inv(torch.eye(g.n_nodes, dtype=torch.float64) - norm) - torch.eye(g.n_nodes))
    assert torch.allclose(influence(norm, w), closed, atol=1e-12)


def test_pruning_keeps_the_main_path_and_drops_the_weak_branch():
    g = planted_graph()
    p = prune(g, node_threshold=0.8, edge_threshold=0.98)
    keep = p.node_mask.tolist()
    assert keep[0] and keep[2] and not keep[1] and not keep[3]
    assert all(keep[6:])  # tokens and logits always stay
    assert p.edge_mask[2, 0] and p.edge_mask[8, 2] and not p.edge_mask[1, 7]
    assert not p.edge_mask[:, ~p.node_mask].any() and not p.edge_mask[~p.node_mask].any()
    # the error feeds the kept path: replacement below 1, and the scores move as the error grows
    s = scores(g)
    assert 0.5 < s.replacement < 1 and 0.5 < s.completeness < 1
    g.adjacency[2, 5] = 5.0
    assert scores(g).replacement < s.replacement


def test_pruned_graph_json_validates_against_the_schema(graph):
    p = prune(graph)
    s = scores(graph)
    data = graph_json(graph, p, slug="tiny", scan="tiny-gpt2", scores=s, labels={("tc1", 3): "a label"},
                      supernodes=[["grp", *node_ids(graph)[:2]]])
    jsonschema.validate(data, SCHEMA)
    ids = {n["node_id"] for n in data["nodes"]}
    assert all(x["source"] in ids and x["target"] in ids for x in data["links"])
    assert {n["feature_type"] for n in data["nodes"]} >= {"embedding", "logit", "cross layer transcoder"}
    assert sum(n["is_target_logit"] for n in data["nodes"]) == 1
    assert 0 < len(data["links"]) < int((graph.adjacency != 0).sum())
    edge = data["links"][0]
    i, j = node_ids(graph).index(edge["target"]), node_ids(graph).index(edge["source"])
    assert edge["weight"] == float(graph.adjacency[i, j])
    assert data["metadata"]["sae_atlas"]["scores"]["replacement"] == s.replacement
    bad = json.loads(json.dumps(data))
    bad["nodes"][0]["node_id"] = "nonsense"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_supernode_sums_its_members_edges(graph):
    f = graph.features
    last = graph.dictionaries[-1]
    latents = sorted(set(f.latent[f.dictionary == len(graph.dictionaries) - 1].tolist()))[:3]
    sn = supernodes(graph, {"circle": [(last, lat) for lat in latents], "empty": [(last, 10_000)]})
    assert [s.label for s in sn] == ["circle"] and len(sn[0].members) >= 3
    c = collapse(graph, sn)
    members = sn[0].members
    A = graph.adjacency
    ls = graph.logit_slice
    new_logits = [c.index_of(i) for i in range(ls.start, ls.stop)]
    assert torch.allclose(c.adjacency[new_logits, 0], A[ls][:, members].sum(1))
    src = graph.token_slice.start + 3
    assert torch.allclose(c.adjacency[0, c.index_of(src)], A[members, src].sum())
    assert c.adjacency[0, 0] == 0
    # every logit node's inputs are conserved (the supernode is not a logit)
    assert torch.allclose(c.adjacency[new_logits].sum(1), A[ls].sum(1))
    by_pos = supernodes(graph, {"circle": [(last, lat) for lat in latents]}, by_position=True)
    assert sum(len(s.members) for s in by_pos) == len(members) and all("@" in s.label for s in by_pos)


def test_interventions_match_the_graph_prediction(gpt2):
    g = build_graph(gpt2, exact_transcoders(gpt2), gpt2.to_tokens(PROMPT)[0])
    first = (g.features.dictionary == 0).nonzero()[:, 0]
    node = int(first[g.features.activation[first].argmax()])
    # features frozen: the measured change is the direct edges exactly
    frozen = intervene(gpt2, g, [NodeEdit("ablate", [node])], recompute=False)
    assert frozen.measured == pytest.approx(frozen.direct, abs=1e-9)
    assert max(map(abs, frozen.measured)) > 1e-4
    # recomputed: a small steer stays linear, so every path of the graph adds up to the change
    small = intervene(gpt2, g, [NodeEdit("steer", [node], 1e-4)])
    assert small.measured == pytest.approx(small.total, abs=1e-10)
    assert max(abs(a - b) for a, b in zip(small.total, small.direct, strict=True)) > 1e-9
    clamp = intervene(gpt2, g, [NodeEdit("clamp", [node], float(g.features.activation[node]))])
    assert max(map(abs, clamp.measured)) < 1e-9
    with pytest.raises(Exception, match="feature nodes"):
        intervene(gpt2, g, [NodeEdit("ablate", [g.n_features])])
