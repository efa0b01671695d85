"""The certified 8-bit exact scan returns exactly what a float32 exhaustive scan returns,
including on near-ties an 8-bit score alone cannot order, and serves large atlas indexes."""

import faiss
import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.index import build_atlas_indexes, load_index, sae_index_path
from sae_atlas.store.int8_scan import Int8Scan, quantize_rows
from sae_atlas.store.search import FeatureSearch
from tests.store.sae_folders import write_sae


def exhaustive(rows: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ rows.T
    ids = np.stack([np.lexsort((np.arange(len(rows)), -s))[:k] for s in scores])
    return np.take_along_axis(scores, ids, axis=1), ids


def test_matches_exhaustive_search_over_many_query_chunks():
    rng = np.random.default_rng(0)
    rows = unit_rows(rng.standard_normal((3000, 48)))
    queries = rng.standard_normal((70, 48)).astype(np.float32) * 7.0  # not unit: bounds scale with ||q||
    for k in (1, 10, 200):
        scores, ids = Int8Scan(rows).search(queries, k)
        want_scores, want_ids = exhaustive(rows, queries, k)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    scores, ids = Int8Scan(rows).search(queries[:2], 5000)  # k above n: every row, ranked
    assert ids.shape == (2, 3000) and all(len(set(row)) == 3000 for row in ids.tolist())
    assert np.all(np.diff(scores, axis=1) <= 0)


def test_near_ties_below_the_quantization_step_come_back_in_exact_order():
    rng = np.random.default_rng(1)
    base = unit_rows(rng.standard_normal((1, 64)))[0]
    rows = unit_rows(rng.standard_normal((500, 64)))
    # 30 rows a hair apart along the query direction: their int8 codes (mostly) coincide.
    rows[100:130] = base + np.linspace(0.0, 3e-4, 30, dtype=np.float32)[:, None] * base
    rows[100:130] = rows[100:130][rng.permutation(30)]
    scan = Int8Scan(rows)
    codes, _ = quantize_rows(rows[100:130])
    assert len(np.unique(codes, axis=0)) < 30  # the 8-bit scores alone cannot order them
    scores, ids = scan.search(base[None, :], 10)
    np.testing.assert_array_equal(ids[0], exhaustive(rows, base[None, :], 10)[1][0])
    assert scan.candidates_seen >= 30  # every tied row was re-scored in float32
    assert np.all(np.diff(scores[0]) <= 0)


def test_zero_rows_and_zero_query():
    rows = np.zeros((20, 8), dtype=np.float32)
    rows[3, 0] = 1.0
    scan = Int8Scan(rows)
    scores, ids = scan.search(np.eye(8, dtype=np.float32)[:1], 2)
    assert ids[0].tolist() == [3, 0] and scores[0].tolist() == [1.0, 0.0]
    scores, ids = scan.search(np.zeros((1, 8), dtype=np.float32), 3)
    assert ids[0].tolist() == [0, 1, 2] and not scores.any()


def test_large_exact_index_is_served_by_the_scan_over_mapped_rows(tmp_path):
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((9000, 32)).astype(np.float32)
    rows[77] = rows[8000] * 3.0 + 1e-3 * rng.standard_normal(32)  # planted near-duplicate
    write_sae(tmp_path, "wide", rows, "blocks.2.hook_resid_post")
    build_atlas_indexes(tmp_path)
    index, sidecar = load_index(sae_index_path(tmp_path, "wide"), tmp_path, {})
    assert isinstance(index, Int8Scan) and sidecar["mmap"] is True and "int8" in sidecar["scan"]
    flat, _ = load_index(sae_index_path(tmp_path, "wide"), tmp_path, {}, scan_threshold=10**9)
    assert isinstance(flat, faiss.Index)
    queries = unit_rows(rng.standard_normal((16, 32)))
    np.testing.assert_array_equal(index.search(queries, 10)[1], flat.search(queries, 10)[1])
    search = FeatureSearch(tmp_path)
    assert [m.latent for m in search.similar("wide", 77, k=1)] == [8000]
    unit = unit_rows(rows)
    assert search.by_vector(unit[4321], k=1, sae_id="wide")[0].latent == 4321


@pytest.mark.parametrize("shape", [(0, 8), (5, 0)])
def test_degenerate_inputs_are_refused(shape):
    with pytest.raises(InvalidInputError, match="at least one row"):
        Int8Scan(np.zeros(shape, dtype=np.float32))


def test_integer_product_runs_with_the_scan_threads_and_restores_torch_threads(monkeypatch):
    rng = np.random.default_rng(3)
    rows = unit_rows(rng.standard_normal((400, 16)))
    queries = rng.standard_normal((40, 16)).astype(np.float32)
    seen = []
    int_mm = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: seen.append(torch.get_num_threads()) or int_mm(a, b))
    before = torch.get_num_threads()
    for threads in (1, 2):
        seen.clear()
        scores, ids = Int8Scan(rows, threads=threads).search(queries, 5)
        assert seen == [threads, threads]  # two query chunks, each with the scan's thread count
        assert torch.get_num_threads() == before
        np.testing.assert_array_equal(ids, exhaustive(rows, queries, 5)[1])
    assert Int8Scan(rows).threads == 1  # the default chosen under load (BENCHMARKS.md)
    with pytest.raises(InvalidInputError, match="at least one thread"):
        Int8Scan(rows, threads=0)
