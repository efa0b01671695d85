"""Planted hierarchy (Park et al. 2024 recipe): children orthogonal to their parent in the
true causal basis, observed through an ill-conditioned re-parametrisation."""

import json

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.causal import causal_basis
from sae_atlas.geometry.hierarchy import (
    feature_hierarchy,
    hierarchy_tests,
    match_by_activation,
    match_by_decoder,
)
from sae_atlas.geometry.trees import (
    ConceptNode,
    ConceptTree,
    TokenizedTree,
    curated_tree,
    tokenize_tree,
    tree_from_json,
)

D, N_BG = 32, 30000
SIZES = {"mammal": 240, "bird": 110, "fish": 40}


def planted(seed: int = 0):
    """Background tokens N(0, I); parent direction p and child directions c_i orthogonal to
    p and each other; child tokens p + c_i + noise. Returns (gamma observed, M, tree)."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    p, kids = 1.2 * Q[0], {k: 1.0 * Q[i + 1] for i, k in enumerate(SIZES)}
    rows = [rng.normal(size=(N_BG, D))]
    ids, start = {}, N_BG
    for k, n in SIZES.items():
        rows.append(p + kids[k] + 0.25 * rng.normal(size=(n, D)))
        ids[k] = np.arange(start, start + n)
        start += n
    g_true = np.concatenate(rows)
    ids["animal"] = np.concatenate([ids[k] for k in SIZES])
    nodes = {"animal": ConceptNode("animal", None, [], list(SIZES))}
    nodes |= {k: ConceptNode(k, "animal", []) for k in SIZES}
    tok = TokenizedTree(ConceptTree(nodes), {k: np.sort(v) for k, v in ids.items()}, {}, {}, [])
    # ill-conditioned re-parametrisation gamma = g_true M (condition number 100)
    U, _ = np.linalg.qr(rng.normal(size=(D, D)))
    M = U @ np.diag(np.logspace(-1, 1, D)) @ U.T
    return g_true @ M, tok, rng


@pytest.fixture(scope="module")
def data():
    return planted()


def _max_abs(result, col="cos_child_parent"):
    return float(np.abs(result.edges[col].to_numpy()).max())


def test_whitened_lda_passes_and_broken_variants_fail(data):
    gamma, tok, _ = data
    good = hierarchy_tests(causal_basis(gamma).unembed(gamma), tok, seed=0)
    assert _max_abs(good) < 0.15
    # controls: random parent and shuffled unembeddings are far from orthogonal
    assert _max_abs(good, "cos_random_parent") > 0.15
    mean_est = hierarchy_tests(causal_basis(gamma).unembed(gamma), tok, estimator="mean", shuffled_control=False)
    assert _max_abs(mean_est) > 0.15
    euclid = causal_basis(gamma, metric="euclidean")
    unwhitened = hierarchy_tests(euclid.unembed(gamma), tok, shuffled_control=False)
    assert _max_abs(unwhitened) > 0.15
    # projection checks: held-out concept tokens ~1, random tokens ~0
    conc = good.concepts
    assert np.all(np.abs(conc["heldout_projection"].to_numpy() - 1) < 0.15)
    assert np.all(np.abs(conc["random_projection"].to_numpy()) < 0.1)
    # simplex: 3 children -> affine rank 2, differences orthogonal to the parent
    simplex = good.simplices.row(0, named=True)
    assert simplex["k"] == 3 and simplex["affine_rank"] == 2
    assert simplex["max_abs_cos_diff_parent"] < 0.15
    assert good.summary["cos_child_parent"]["max_abs"] == pytest.approx(_max_abs(good))


def test_cosines_invariant_to_reparametrisation(data):
    gamma, tok, rng = data
    A, _ = np.linalg.qr(rng.normal(size=(D, D)))
    B, _ = np.linalg.qr(rng.normal(size=(D, D)))
    M = A @ np.diag(np.logspace(-0.5, 0.5, D)) @ B  # invertible, not orthogonal, condition 10
    assert causal_basis(gamma @ M).n_floored == 0
    a = hierarchy_tests(causal_basis(gamma).unembed(gamma), tok, shuffled_control=False)
    b = hierarchy_tests(causal_basis(gamma @ M).unembed(gamma @ M), tok, shuffled_control=False)
    for col in ("cos_child_parent", "cos_random_parent"):
        np.testing.assert_allclose(a.edges[col].to_numpy(), b.edges[col].to_numpy(), atol=1e-6)


def test_sae_features_matched_and_orthogonal(data):
    gamma, tok, rng = data
    basis = causal_basis(gamma)
    g = basis.unembed(gamma)
    true = hierarchy_tests(g, tok, shuffled_control=False)
    from sae_atlas.geometry.concept_vectors import concept_vector
    vecs = {n: concept_vector(g[ids]) for n, ids in tok.token_ids.items()}
    # an SAE whose first 4 latents point along the concepts (in residual space), plus noise latents
    dirs_g = np.concatenate([np.stack([vecs[n] for n in ("animal", *SIZES)]), rng.normal(size=(60, D))])
    W_dec = dirs_g @ np.linalg.inv(basis.A_inv_DD)  # residual-space rows whose embed() is dirs_g
    matches = match_by_decoder(vecs, basis.embed(W_dec))
    assert [matches[n][0][0] for n in ("animal", *SIZES)] == [0, 1, 2, 3]
    table = feature_hierarchy(g, tok, basis.embed(W_dec), matches)
    assert np.abs(table["cos_child_parent"].to_numpy()).max() < 0.15
    assert np.abs(table["cos_random_parent"].to_numpy()).min() > 0.15
    assert true.edges.height == table.height
    # activation matching: latent i fires on concept i's tokens
    token_ids = np.concatenate([tok.token_ids[n] for n in SIZES] + [np.arange(200)])
    acts = np.zeros((len(token_ids), 64))
    for j, n in enumerate(SIZES):
        acts[np.isin(token_ids, tok.token_ids[n]), j + 1] = 1.0
    acts[: len(token_ids) - 200, 0] = 1.0
    by_act = match_by_activation(acts, token_ids, tok.token_ids)
    assert [by_act[n][0][0] for n in ("animal", *SIZES)] == [0, 1, 2, 3]


def test_curated_tree_and_tokenizer_filter(tmp_path):
    tree = curated_tree()
    words = tree.words_under(tree.root)
    assert len(words) == len(set(words)) > 300
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    # a toy tokenizer: " word" is one token only for words shorter than 7 letters
    def encode(s):
        w = s[1:] if s.startswith(" ") else None
        return [vocab[w]] if w in vocab and len(w) < 7 else [0, 1]
    tt = tokenize_tree(tree, encode, min_tokens=5)
    assert all(len(w) < 7 for w in tt.word_ids)
    for name in tt.tree.nodes:
        assert len(tt.token_ids[name]) >= 5
        parent = tt.tree.nodes[name].parent
        if parent:
            assert set(tt.token_ids[name]) < set(tt.token_ids[parent])
    # JSON round trip, a word in two unrelated branches is dropped, too-small nodes pruned
    spec = {"name": "root", "words": [], "children": [
        {"name": "a", "words": ["x1", "x2", "x3", "dup"], "children": [{"name": "a1", "words": ["x1"]}]},
        {"name": "b", "words": ["y1", "y2", "y3", "dup"]}]}
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(spec))
    ids = {w: i for i, w in enumerate(["x1", "x2", "x3", "y1", "y2", "y3", "dup"])}
    tt = tokenize_tree(tree_from_json(path), lambda s: [ids[s.strip()]], min_tokens=2)
    assert "dup" in tt.dropped_words and "a1" in tt.dropped_nodes
    assert sorted(tt.tree.nodes) == ["a", "b", "root"] and len(tt.token_ids["root"]) == 6
    path.write_text(json.dumps({"name": "r", "words": "nope"}))
    with pytest.raises(InvalidInputError):
        tree_from_json(path)


WN_DATA = """  1 This is a fake licence header line
00001740 03 n 01 entity 0 002 ~ 00002000 n 0000 ~ 00003000 n 0000 | that which exists
00002000 05 n 02 animal 0 beast 0 003 @ 00001740 n 0000 ~ 00004000 n 0000 ~ 00005000 n 0000 | a living thing
00003000 06 n 01 artifact 0 001 @ 00001740 n 0000 | a man-made object
00004000 05 n 02 dog 0 domestic_dog 0 001 @ 00002000 n 0000 | a canine
00005000 05 n 01 cat 0 001 @ 00002000 n 0000 | a feline
"""
WN_INDEX = """  1 This is a fake licence header line
animal n 1 2 @ ~ 1 0 00002000
artifact n 1 1 @ 1 0 00003000
beast n 1 1 @ 1 0 00002000
cat n 1 1 @ 1 0 00005000
dog n 1 1 @ 1 0 00004000
entity n 1 1 ~ 1 0 00001740
"""


def test_wordnet_reader(tmp_path):
    from sae_atlas.geometry.trees import wordnet_tree
    assert wordnet_tree(directory=tmp_path) is None  # no database: skipped cleanly
    (tmp_path / "data.noun").write_text(WN_DATA)
    (tmp_path / "index.noun").write_text(WN_INDEX)
    tree = wordnet_tree("entity.n.01", directory=tmp_path)
    assert list(tree.nodes) == ["entity.n.01", "animal.n.01", "artifact.n.01", "dog.n.01", "cat.n.01"]
    assert tree.nodes["dog.n.01"].parent == "animal.n.01"
    assert tree.nodes["dog.n.01"].words == ["dog"]  # multi-word lemma dropped
    assert sorted(tree.words_under("animal.n.01")) == ["animal", "beast", "cat", "dog"]
    with pytest.raises(InvalidInputError):
        wordnet_tree("nothing.n.01", directory=tmp_path)


def test_real_wordnet_when_installed():
    from sae_atlas.geometry.trees import wordnet_dir, wordnet_tree
    if wordnet_dir() is None:
        pytest.skip("no WordNet database installed (Debian: apt-get install wordnet-base)")
    tree = wordnet_tree("bird.n.01")
    assert "eagle" in tree.words_under("bird.n.01") and len(tree.nodes) > 100
    assert all(tree.nodes[p].children for _, p in tree.edges())
