"""Maps: UMAP keeps tight clusters' neighbourhoods (overlap ~1) and says so when it cannot."""

import json

import numpy as np
import pytest

from geometry.maps import (
    attach_labels,
    feature_map,
    knn_overlap,
    labels_from_clusters,
    map_frame,
    read_map,
    write_map,
)
from geometry.results import list_runs, read_analysis, write_analysis
from store.errors import IntegrityError, InvalidInputError, NotFoundError


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
    (tmp_path / "saes" / "sae-a").mkdir(parents=True)
    (tmp_path / "saes" / "sae-a" / "cfg.json").write_text("{}")
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
