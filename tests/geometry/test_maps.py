"""Maps: UMAP keeps tight clusters' neighbourhoods (overlap ~1) and says so when it cannot."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.geometry.maps import basis_maps, feature_map, knn_overlap, labels_from_clusters
from sae_atlas.store.analysis_runs import list_runs, read_analysis, write_analysis
from sae_atlas.store.maps import (
    attach_labels,
    basis_frame,
    map_frame,
    map_scores,
    read_map,
    stored_summary,
    write_map,
)
from tests.store.sae_folders import write_sae


def test_umap_map_overlap_and_storage(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(20, 32))
    clustered = np.repeat(centres, 11, axis=0) + 0.02 * rng.normal(size=(220, 32))  # k=10 -> own cluster
    fmap = feature_map(clustered, k_overlap=10, n_neighbors=10, seed=0, n_epochs=100)
    assert fmap.summary["knn_overlap_mean"] > 0.95
    noise = rng.normal(size=(220, 32))  # no low-dimensional structure: the map cannot keep it
    noisy = feature_map(noise, k_overlap=10, n_neighbors=10, seed=0, n_epochs=100)
    assert noisy.summary["knn_overlap_mean"] < 0.6
    np.testing.assert_allclose(knn_overlap(noise, noisy.coords_F2, 10), noisy.overlap_F)
    # points on a circle mapped to themselves keep every neighbourhood; shuffled coordinates do not
    angle = rng.uniform(0, 2 * np.pi, 100)
    circle = np.stack([np.cos(angle), np.sin(angle)], 1)
    assert knn_overlap(circle, circle, 10).min() == 1.0
    assert knn_overlap(circle, rng.permutation(circle), 10).mean() < 0.3
    # storage: saes/<id>/map.parquet + map.json, labels attachable later
    write_sae(tmp_path, "sae-a", np.eye(4, dtype=np.float32), "blocks.0.hook_resid_post")  # maps record its weights
    frame = map_frame(fmap, {"true_cluster": np.repeat(np.arange(20), 11)})
    write_map(tmp_path, "sae-a", frame, fmap.params, fmap.summary)
    attach_labels(tmp_path, "sae-a", {"lobe": labels_from_clusters([np.arange(11)], 220)})
    table, meta = read_map(tmp_path, "sae-a")
    assert table.columns == ["latent", "x", "y", "knn_overlap", "true_cluster", "lobe"]
    assert meta["params"]["metric"] == "cosine" and meta["label_columns"] == ["true_cluster", "lobe"]
    assert table["lobe"].to_list()[:12] == [0] * 11 + [-1]
    with pytest.raises(InvalidInputError):
        attach_labels(tmp_path, "sae-a", {"x": np.zeros(220)})
    (tmp_path / "saes" / "sae-a" / "map.parquet").write_bytes(b"junk")
    with pytest.raises(IntegrityError):
        read_map(tmp_path, "sae-a")


def test_results_round_trip(tmp_path):
    import polars as pl

    t = pl.DataFrame({"a": [1, 2]})
    js = write_analysis(tmp_path, "hierarchy", "run1", parameters={"seed": 0}, summary={"x": 1.0},
                        tables={"main": t, "edges": t})
    assert json.loads(js.read_text())["created_with"]["python"]
    run = read_analysis(tmp_path, "hierarchy", "run1")
    assert run.table.equals(t) and run.tables["edges"].equals(t) and run.meta["parameters"] == {"seed": 0}
    assert list_runs(tmp_path, "hierarchy") == ["run1"]
    with pytest.raises(NotFoundError):
        read_analysis(tmp_path, "hierarchy", "nope")
    (js.parent / "run1.edges.parquet").write_bytes(b"x")
    with pytest.raises(IntegrityError):
        read_analysis(tmp_path, "hierarchy", "run1")
    with pytest.raises(InvalidInputError):
        write_analysis(tmp_path, "hierarchy", "../evil", parameters={})


def _group_purity(coords_F2: np.ndarray, groups_F: np.ndarray, k: int = 10) -> float:
    """Mean share of a planted-group member's k nearest map points in its own group."""
    d = ((coords_F2[:, None] - coords_F2[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    members = np.flatnonzero(groups_F >= 0)
    nearest = np.argsort(d[members], axis=1)[:, :k]
    return float((groups_F[nearest] == groups_F[members][:, None]).mean())


def test_cooccurrence_map_separates_cofiring_groups(tmp_path):
    """Two groups of latents that co-fire, decoder rows random: only the co-occurrence map
    separates the groups, and each map's scores say which basis it keeps."""
    rng = np.random.default_rng(0)
    F, B = 121, 600
    groups = np.repeat([0, 1, -1], [40, 40, 41])
    occ = rng.random((B, F)) < 0.03
    for g in (0, 1):
        blocks = rng.random(B) < 0.3
        occ[np.ix_(blocks, groups == g)] |= rng.random((blocks.sum(), 40)) < 0.7
    occ[:, -1] = False  # a dead latent: no co-occurrence partner, no co-occurrence score
    W = rng.normal(size=(F, 32))
    maps = basis_maps(W, sp.csr_matrix(occ), k_overlap=10, n_neighbors=10, seed=0, n_epochs=100)
    dec, cooc = maps["decoder"], maps["cooccurrence"]
    purity = {b: _group_purity(m.coords_F2, groups) for b, m in maps.items()}
    assert purity["cooccurrence"] > 0.8 and purity["decoder"] < 0.6, purity  # chance ~ 39/120 (seed 0: 0.94, 0.37)
    s_dec, s_cooc = dec.summary, cooc.summary
    # each map keeps its own basis' neighbours better than the other map does
    assert s_cooc["knn_overlap_mean"] > s_dec["other_basis_overlap_mean"]
    assert s_dec["knn_overlap_mean"] > s_cooc["other_basis_overlap_mean"]
    assert np.isnan(cooc.overlap_F[-1]) and np.isfinite(s_cooc["knn_overlap_mean"])
    # stored beside the decoder map in map.parquet; each basis readable with its scores
    write_sae(tmp_path, "sae-a", np.eye(4, dtype=np.float32), "blocks.0.hook_resid_post")  # maps record its weights
    frame = map_frame(dec, {"group": groups}, cooccurrence=cooc)
    write_map(tmp_path, "sae-a", frame, *stored_summary(maps))
    table, meta = read_map(tmp_path, "sae-a")
    assert meta["label_columns"] == ["group"]
    as_cooc = basis_frame(table, "cooccurrence")
    assert as_cooc.columns == ["latent", "x", "y", "knn_overlap", "group"]
    np.testing.assert_allclose(as_cooc["x"].to_numpy(), cooc.coords_F2[:, 0])
    assert as_cooc["knn_overlap"][-1] is None  # no score is null, not NaN
    np.testing.assert_allclose(basis_frame(table, "decoder")["y"].to_numpy(), dec.coords_F2[:, 1])
    scores = map_scores(table, meta)
    assert scores["cooccurrence"]["knn_overlap_mean"] == pytest.approx(s_cooc["knn_overlap_mean"])
    assert scores["decoder"]["other_basis_overlap_mean"] == pytest.approx(s_dec["other_basis_overlap_mean"])
    with pytest.raises(InvalidInputError):
        attach_labels(tmp_path, "sae-a", {"cooc_x": np.zeros(F)})
    with pytest.raises(InvalidInputError):
        basis_maps(W[:-1], sp.csr_matrix(occ))
    # a map without the co-occurrence basis says how to build it
    write_map(tmp_path, "sae-a", map_frame(dec), dec.params, dec.summary)
    with pytest.raises(NotFoundError, match="summarize"):
        basis_frame(read_map(tmp_path, "sae-a")[0], "cooccurrence")
    assert list(map_scores(*read_map(tmp_path, "sae-a"))) == ["decoder"]
