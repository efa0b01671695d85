"""Neighbour tables written by the index build for pairs too large to compute on load: both
directions of a pair from one product, memory-mapped by the search, equal to the index's
answers; a stale or damaged table is never read."""

import numpy as np
import pytest

import sae_atlas.store.neighbour_tables as tables_module
import sae_atlas.store.search as search_module
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.index import build_atlas_indexes
from sae_atlas.store.neighbour_tables import load_table, nearest_rows, table_path
from sae_atlas.store.search import FeatureSearch
from tests.store.sae_folders import write_sae

SIZES = {"l0": 90, "l2": 70, "l5": 50}


@pytest.fixture
def persisted(tmp_path, monkeypatch):
    """Three SAEs (one width) whose pairs all count as large: the build writes every table."""
    rng = np.random.default_rng(5)
    direction = rng.standard_normal(16)
    for layer, (sae_id, n) in zip([0, 2, 5], SIZES.items(), strict=True):
        rows = rng.standard_normal((n, 16))
        rows[layer] = direction + 0.05 * rng.standard_normal(16)  # one direction through the layers
        write_sae(tmp_path, sae_id, rows.astype(np.float32), f"blocks.{layer}.hook_resid_post")
    monkeypatch.setattr(tables_module, "TABLE_MAX_PAIRS", 0)
    monkeypatch.setattr(search_module, "TABLE_MAX_PAIRS", 0)
    build_atlas_indexes(tmp_path)
    return tmp_path


def _same(a, b):
    """Equal match lists up to float rounding of the cosines."""
    return ([(m.sae_id, m.latent, m.rank, m.layer) for m in a] == [(m.sae_id, m.latent, m.rank, m.layer) for m in b]
            and np.allclose([m.cosine for m in a], [m.cosine for m in b], atol=1e-5))


def test_one_product_gives_both_directions_exactly():
    rng = np.random.default_rng(0)
    a, b = unit_rows(rng.standard_normal((2500, 24))), unit_rows(rng.standard_normal((700, 24)))
    (ids_ab, cos_ab), (ids_ba, cos_ba) = nearest_rows(a, b, both=True)
    truth_ab, truth_ba = a @ b.T, b @ a.T
    assert ids_ab.shape == (2500, 16) and ids_ba.shape == (700, 16)  # 3 blocks of a: the column merge runs
    assert np.array_equal(ids_ab, np.argsort(-truth_ab, axis=1)[:, :16])
    assert np.array_equal(ids_ba, np.argsort(-truth_ba, axis=1)[:, :16])
    assert np.allclose(cos_ba, np.take_along_axis(truth_ba, ids_ba, axis=1), atol=1e-5)
    assert np.all(np.diff(cos_ab, axis=1) <= 0) and np.all(np.diff(cos_ba, axis=1) <= 0)


def test_written_tables_answer_like_the_index(persisted, monkeypatch):
    search = FeatureSearch(persisted)
    for source in SIZES:
        for target in SIZES:
            ids, _ = search.neighbour_table(source, target)
            assert isinstance(ids.base, np.memmap) or isinstance(ids, np.memmap)  # read from the file
            assert ids.shape == (SIZES[source], 16)
    similar = [search.similar("l2", i, k=10) for i in range(SIZES["l2"])]
    flows = [search.flow("l2", i, k=3) for i in range(SIZES["l2"])]
    assert [(m.sae_id, m.latent) for m in search.flow("l0", 0, k=1)] == [("l2", 2), ("l5", 5)]
    monkeypatch.setattr(search_module, "load_table", lambda *args: None)  # no tables: the index answers
    direct = FeatureSearch(persisted)
    assert direct.neighbour_table("l2", "l0") is None
    assert all(_same(m, direct.similar("l2", i, k=10)) for i, m in enumerate(similar))
    assert all(_same(m, direct.flow("l2", i, k=3)) for i, m in enumerate(flows))


def test_stale_or_damaged_tables_are_not_read_and_the_build_rewrites_them(persisted):
    search = FeatureSearch(persisted)
    search.sae_index("l0")
    search.sae_index("l5")
    shas = search._shas
    assert load_table(persisted, "l0", "l5", shas["l0"], shas["l5"]) is not None
    assert load_table(persisted, "l0", "l5", shas["l0"], "0" * 64) is None  # other target weights: stale
    path = table_path(persisted, "l0", "l5")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert load_table(persisted, "l0", "l5", shas["l0"], shas["l5"]) is None
    assert FeatureSearch(persisted).neighbour_table("l0", "l5") is None  # searches go to the index
    table_path(persisted, "l5", "l2").unlink()
    build_atlas_indexes(persisted)
    assert load_table(persisted, "l0", "l5", shas["l0"], shas["l5"]) is not None
    assert FeatureSearch(persisted).neighbour_table("l5", "l2") is not None


def test_small_pairs_write_no_files(tmp_path):
    rng = np.random.default_rng(1)
    write_sae(tmp_path, "a", rng.standard_normal((40, 8)).astype(np.float32), "blocks.0.hook_resid_post")
    build_atlas_indexes(tmp_path)
    assert not (tmp_path / "indexes" / "neighbours").exists()
    assert FeatureSearch(tmp_path).neighbour_table("a", "a")[0].shape == (40, 16)
