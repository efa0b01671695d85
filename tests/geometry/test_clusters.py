"""Clustering of decoder rows and the circular-feature discovery pipeline (planted)."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from sae_atlas.api.analyses.circular import write_circular_run
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.geometry.circular_discovery import DiscoveryParams, discover_circular
from sae_atlas.geometry.clusters import (
    graph_clusters,
    knn_cosine,
    spectral_affinity,
    spectral_clusters,
)
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.analysis_runs import read_analysis


def planted_circle_decoder(seed: int, n_random: int = 500, d: int = 64, n_circle: int = 7):
    """`n_circle` rows u3 + 0.8 (cos t u1 + sin t u2) hidden (shuffled) among random rows."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(d, 3)))
    t = 2 * np.pi * np.arange(n_circle) / n_circle
    circle = U[:, 2] + 0.8 * (np.cos(t)[:, None] * U[:, 0] + np.sin(t)[:, None] * U[:, 1])
    W = np.vstack([rng.normal(size=(n_random, d)), circle * rng.uniform(0.5, 3.0, (n_circle, 1))])
    perm = rng.permutation(len(W))
    where = np.sort(np.flatnonzero(perm >= n_random))  # positions of the circle rows
    return W[perm], where, t[perm[where] - n_random]  # rows, their positions, their angles


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_graph_clustering_returns_exactly_the_planted_circle(seed):
    W, circle, _ = planted_circle_decoder(seed)
    clusters = graph_clusters(W, k=2, threshold=0.5)
    containing = [c for c in clusters if np.isin(circle, c).any()]
    assert len(containing) == 1
    np.testing.assert_array_equal(containing[0], circle)


def test_mutual_edges_keep_a_stray_row_out():
    # seed 0 hides a random row at cosine 0.503 to one circle row: the paper's
    # either-direction rule lets it chain on, the mutual rule does not.
    W, circle, _ = planted_circle_decoder(0)
    union = [c for c in graph_clusters(W) if np.isin(circle, c).any()]
    assert len(union) == 1 and len(union[0]) == 8
    for seed in (0, 5, 8):
        W, circle, _ = planted_circle_decoder(seed)
        mutual = [c for c in graph_clusters(W, mutual=True) if np.isin(circle, c).any()]
        assert len(mutual) == 1
        np.testing.assert_array_equal(mutual[0], circle)


def test_knn_excludes_self_and_matches_brute_force():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(300, 16))
    cos, idx = knn_cosine(unit_rows(W), 5)
    U = unit_rows(W)
    G = U @ U.T
    np.fill_diagonal(G, -np.inf)
    want = np.sort(G, axis=1)[:, ::-1][:, :5]
    np.testing.assert_allclose(cos, want, atol=1e-5)
    assert not (idx == np.arange(300)[:, None]).any()


def test_spectral_recovers_planted_groups_dense_and_sparse():
    rng = np.random.default_rng(0)
    d, n_groups, per = 32, 6, 40
    centres = rng.normal(size=(n_groups, d))
    W = np.repeat(centres, per, axis=0) + 0.25 * rng.normal(size=(n_groups * per, d))
    truth = np.repeat(np.arange(n_groups), per)
    for dense_max in (10_000, 10):  # dense affinity, then the sparse kNN affinity
        clusters = spectral_clusters(W, n_groups, seed=0, n_neighbors=15, dense_max=dense_max)
        assert sorted(len(c) for c in clusters) == [per] * n_groups
        for c in clusters:
            assert len(set(truth[c])) == 1
    A = spectral_affinity(W, n_neighbors=15, dense_max=10)
    assert sp.issparse(A) and (A != A.T).nnz == 0 and A.nnz <= len(W) * 31


def test_spectral_rejects_bad_cluster_count():
    with pytest.raises(InvalidInputError, match="n_clusters"):
        spectral_clusters(np.eye(5), 9)


def planted_activations(seed: int = 0, n_tokens: int = 6000):
    """A decoder with a circular 7-feature cluster and a 'two-line' 2-feature cluster,
    plus background features, and CSR activations in which each family fires."""
    rng = np.random.default_rng(seed)
    d, n_bg = 96, 150
    U, _ = np.linalg.qr(rng.normal(size=(d, 6)))
    t = 2 * np.pi * np.arange(7) / 7
    circle = U[:, 2] + 0.8 * (np.cos(t)[:, None] * U[:, 0] + np.sin(t)[:, None] * U[:, 1])
    lines = np.stack([U[:, 3] + 0.6 * U[:, 4], U[:, 3] + 0.6 * U[:, 5]])  # cos ~ 0.74
    W = np.vstack([circle, lines, rng.normal(size=(n_bg, d))])
    F = len(W)
    A = np.zeros((n_tokens, F))
    phi = rng.uniform(0, 2 * np.pi, n_tokens)
    on_circle = rng.random(n_tokens) < 0.4
    bump = np.maximum(np.cos(phi[:, None] - t[None]), 0) ** 2  # smooth bumps around the ring
    A[on_circle, :7] = bump[on_circle]
    on_lines = (~on_circle) & (rng.random(n_tokens) < 0.5)
    which = rng.integers(0, 2, n_tokens)
    A[on_lines, 7 + which[on_lines]] = rng.exponential(1.0, on_lines.sum())
    bg = rng.random((n_tokens, n_bg)) < 0.02
    A[:, 9:] = bg * rng.exponential(1.0, (n_tokens, n_bg))
    token_ids = np.where(on_circle, 100 + np.floor(phi / (2 * np.pi) * 7).astype(int), rng.integers(0, 50, n_tokens))
    return W, sp.csr_matrix(A), token_ids


def test_discovery_ranks_the_circle_first_and_round_trips(tmp_path):
    W, acts, token_ids = planted_activations()
    result = discover_circular(W, acts, token_ids, DiscoveryParams(min_tokens=32))
    table = result.table
    assert table["rank"].to_list() == list(range(len(table)))
    top = table.row(0, named=True)
    assert top["features"] == list(range(7))
    assert table["score"].is_sorted(descending=True)
    lines = table.filter(table["features"].list.first() == 7).row(0, named=True)
    assert lines["features"] == [7, 8] and lines["score"] < top["score"]
    assert set(top["top_token_ids"][:7]) == set(range(100, 107))
    assert len(top["proj_x"]) == len(top["proj_y"]) == min(top["n_tokens"], 1000)

    write_circular_run(tmp_path, "run1", result, extra={"sae_id": "planted"})
    stored = read_analysis(tmp_path, "circular", "run1")
    back, meta = stored.table, stored.meta
    assert back.equals(table)
    on_disk = json.loads((tmp_path / "analyses" / "circular" / "run1.json").read_text())
    assert on_disk["parameters"]["method"] == "graph" and "created_with" in on_disk
    assert meta["sae_id"] == "planted"
    with pytest.raises(NotFoundError, match="run1"):
        read_analysis(tmp_path, "circular", "nope")


def test_discovery_checks_shapes():
    W, acts, token_ids = planted_activations(n_tokens=200)
    with pytest.raises(InvalidInputError, match="features"):
        discover_circular(W[:-1], acts, token_ids)
    with pytest.raises(InvalidInputError, match="token_ids"):
        discover_circular(W, acts, token_ids[:-1])


def test_discover_from_an_atlas_through_the_cli(tmp_path):
    """Cache planted residuals, save an SAE that encodes them exactly, run the CLI verb."""
    import torch
    import typer
    from typer.testing import CliRunner

    from sae_atlas.api.commands.analyze_circular import register_analyze
    from sae_atlas.saes.formats import save_saelens
    from sae_atlas.saes.sae.architectures import build_sae
    from sae_atlas.saes.sae.base import SAEConfig
    from sae_atlas.store.activations import ActivationWriter

    rng = np.random.default_rng(0)
    d, T, n_blocks = 64, 64, 60
    W, circle, t_of = planted_circle_decoder(0, n_random=20, d=d)  # 27 independent rows
    F = len(W)
    phi = rng.uniform(0, 2 * np.pi, (n_blocks, T))
    A = np.zeros((n_blocks, T, F))
    A[..., circle] = np.maximum(np.cos(phi[..., None] - t_of), 0) ** 2
    others = np.setdiff1d(np.arange(F), circle)
    A[..., others] = (rng.random((n_blocks, T, len(others))) < 0.05) * rng.exponential(1.0, (n_blocks, T, len(others)))
    x = torch.tensor(A @ W, dtype=torch.float32)
    hook = "blocks.0.hook_resid_post"
    writer = ActivationWriter(tmp_path, hook, d=d, model="planted", context_size=T, prepend_bos=False)
    writer.append(x, torch.randint(0, 50, (n_blocks, T)), torch.arange(n_blocks))
    writer.finish()
    sae = build_sae(SAEConfig("standard", d_in=d, d_sae=F, hook_name=hook))
    with torch.no_grad():
        sae.W_dec.copy_(torch.tensor(W, dtype=torch.float32))
        sae.W_enc.copy_(torch.linalg.pinv(sae.W_dec))
    save_saelens(sae, tmp_path / "saes" / "planted")
    (tmp_path / "atlas.json").write_text(json.dumps({"model": "planted"}))  # what `cache` writes first

    app = typer.Typer()
    analyze = typer.Typer()
    app.add_typer(analyze, name="analyze")
    register_analyze(analyze)
    out = CliRunner().invoke(app, ["analyze", "circular", "discover", str(tmp_path),
                                   "--sae", "planted", "--split", "all", "--json"])
    assert out.exit_code == 0, out.output
    stored = read_analysis(tmp_path, "circular", "planted-graph")
    table, meta = stored.table, stored.meta
    assert table.row(0, named=True)["features"] == circle.tolist()
    assert meta["hook"] == hook and meta["figures"]
    assert (tmp_path / "analyses" / "circular" / meta["figures"][0]).stat().st_size > 1000
    bad = CliRunner().invoke(app, ["analyze", "circular", "discover", str(tmp_path), "--sae", "nope"])
    assert bad.exit_code == 2 and "unknown SAE id" in bad.output
