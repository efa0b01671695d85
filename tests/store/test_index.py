"""FAISS indexes and feature search on planted decoder rows."""


import numpy as np
import pytest

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.index import (
    build_atlas_indexes,
    build_index,
    model_index_path,
    sae_index_path,
)
from sae_atlas.store.search import FeatureSearch, Filters
from tests.store.sae_folders import write_sae


@pytest.fixture
def atlas(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 24)).astype(np.float32)
    a[17] = a[5] * 3.0 + 0.01 * rng.standard_normal(24)  # planted near-duplicate (other scale)
    b = rng.standard_normal((200, 24)).astype(np.float32)
    b[40] = a[5] * 0.5 + 0.02 * rng.standard_normal(24)  # the same direction one layer up
    write_sae(tmp_path, "l1", a, "blocks.1.hook_resid_post")
    write_sae(tmp_path, "l3", b, "blocks.3.hook_resid_post")
    build_atlas_indexes(tmp_path)
    return tmp_path, a, b


def test_near_duplicates_are_each_others_neighbours(atlas):
    root, a, _ = atlas
    search = FeatureSearch(root)
    assert search.similar("l1", 5, k=3)[0].latent == 17
    assert search.similar("l1", 17, k=3)[0].latent == 5
    assert all(m.latent != 5 for m in search.similar("l1", 5, k=10))


def test_vector_equal_to_row_returns_it_first(atlas):
    root, a, _ = atlas
    search = FeatureSearch(root)
    for latent in (0, 123, 299):
        hit = search.by_vector(a[latent] * 7.5, k=5, sae_id="l1")[0]
        assert hit.latent == latent and hit.cosine == pytest.approx(1.0, abs=1e-5)


def test_model_wide_index_maps_ids_back(atlas):
    root, a, b = atlas
    search = FeatureSearch(root)
    for sae_id, rows in (("l1", a), ("l3", b)):
        for latent in (0, 7, len(rows) - 1):
            hit = search.by_vector(rows[latent], k=1)[0]
            assert (hit.sae_id, hit.latent) == (sae_id, latent)
    across = search.similar("l1", 5, k=2, across_saes=True)
    assert {(m.sae_id, m.latent) for m in across} == {("l1", 17), ("l3", 40)}
    flow = search.flow("l1", 5)
    assert [(m.sae_id, m.latent, m.layer) for m in flow] == [("l3", 40, 3)]


def test_filters(atlas):
    root, a, _ = atlas
    density = np.full(300, 0.01)
    density[17] = 0.0
    density[::2] = 0.5
    density[17] = 0.0
    search = FeatureSearch(root, densities={"l1": density})
    hits = search.similar("l1", 5, k=20, filters=Filters(exclude_dead=True, max_density=0.1))
    assert len(hits) == 20 and all(density[m.latent] == 0.01 for m in hits)
    layer3 = search.by_vector(a[5], k=5, filters=Filters(layers=(3,)))
    assert {m.sae_id for m in layer3} == {"l3"}


def test_bad_queries(atlas):
    root, _, _ = atlas
    search = FeatureSearch(root)
    with pytest.raises(InvalidInputError, match="dimension 5.*d=24"):
        search.by_vector(np.ones(5))
    with pytest.raises(InvalidInputError, match="k must be between"):
        search.similar("l1", 0, k=10_000)
    with pytest.raises(NotFoundError, match="latents 0..299"):
        search.similar("l1", 300)
    with pytest.raises(NotFoundError, match="unknown SAE id 'nope'.*l1, l3"):
        search.similar("nope", 0)


def test_corrupt_truncated_and_stale_indexes(atlas):
    root, a, _ = atlas
    path = sae_index_path(root, "l1")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(IntegrityError, match="index.faiss.*corrupt or truncated.*--rebuild"):
        FeatureSearch(root).similar("l1", 0)
    build_atlas_indexes(root)  # repairs what is broken
    assert FeatureSearch(root).similar("l1", 5)[0].latent == 17
    write_sae(root, "l1", a[::-1].copy(), "blocks.1.hook_resid_post")  # retrained SAE
    with pytest.raises(IntegrityError, match="stale"):
        FeatureSearch(root).similar("l1", 0)
    with pytest.raises(IntegrityError, match=r"saes/l1/index.faiss: stale: derived from other weights"):
        FeatureSearch(root).by_vector(a[0])  # the model-wide search names the SAE whose weights changed
    for own in (path, path.with_suffix(".json")):
        own.unlink()
    with pytest.raises(IntegrityError, match="model.faiss.*stale"):
        FeatureSearch(root).by_vector(a[0])  # without its own index, the model-wide one is refused
    rebuilt = build_atlas_indexes(root)
    assert all(r["rebuilt"] for r in rebuilt if r["path"] != str(sae_index_path(root, "l3")))
    assert model_index_path(root).exists()
    assert FeatureSearch(root).similar("l1", 299 - 5)[0].latent == 299 - 17


def test_approximate_index_meets_its_recorded_recall():
    rng = np.random.default_rng(1)
    centres = unit_rows(rng.standard_normal((64, 32)))
    rows = unit_rows(centres[rng.integers(0, 64, 20_000)] + 0.3 * rng.standard_normal((20_000, 32)))
    index, info = build_index(rows, approx_threshold=10_000, seed=0)
    assert info["type"] == "IndexRefineFlat(IndexIVFPQFastScan)" and not info["exact"]
    assert info["recall_at_10"] >= 0.95 and info["params"]["nprobe"] < info["params"]["nlist"]
    queries = unit_rows(rows[:200] + 0.01 * rng.standard_normal((200, 32)))
    truth = np.argsort(-queries @ rows.T, axis=1)[:, :10]
    _, found = index.search(queries, 10)
    recall = np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, found, strict=True)])
    assert recall >= info["recall_at_10"] - 0.05
