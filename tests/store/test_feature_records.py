"""Geometry records beside features.parquet: built from planted analysis runs, the search
filters return exactly the planted members, and a damaged table is a named error."""

import numpy as np
import polars as pl
import pytest

from sae_atlas.api.results.meaning import ConceptFeature, ConceptResult
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.services.meaning import save_concept_run
from sae_atlas.errors import IntegrityError
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.feature_records import read_records, record_paths
from sae_atlas.store.geometry_records import rebuild_geometry_records
from sae_atlas.store.index import build_atlas_indexes
from sae_atlas.store.search import FeatureSearch, Filters
from tests.store.sae_folders import write_sae

SAE = "l3"
N_LATENTS = 60
WEEK = [3, 9, 17, 25, 40, 51, 58]  # selective features of a cyclic period-7 concept
MONTH = [1, 2, 5]  # of a period-12 one
NOT_CYCLIC = [20, 21]  # of an ordered concept whose values are out of order
CLUSTER = [10, 11]  # a discovered circular cluster (period unknown)


def _concept(root, run, latents, *, period, cyclic, non_selective=()):
    rows = [{"sae_id": SAE, "hook": "blocks.3.hook_resid_post", "latent": i, "selective": True, "selectivity": 0.9,
             "fire_rate": 0.3, "mean_act": 1.0, "value": "v", "span_order": n if n < 2 else None}
            for n, i in enumerate(latents)]
    rows += [{**rows[0], "latent": i, "selective": False, "span_order": None} for i in non_selective]
    fit = {"cyclic_order": cyclic, "fitted_period": period, "r2": 0.9}
    result = ConceptResult(concept={"name": run, "values": ["a", "b", "c"]}, kind="ordered",
                           per_sae={SAE: {"hook": "h", "span": list(latents[:2]), "fit": fit, "score": 0.9}},
                           best=SAE, features=Rows.of(ConceptFeature, rows))
    save_concept_run(root, run, result, {"saes": [SAE]})


@pytest.fixture
def planted(tmp_path):
    rng = np.random.default_rng(0)
    write_sae(tmp_path, SAE, rng.standard_normal((N_LATENTS, 16)).astype(np.float32), "blocks.3.hook_resid_post")
    build_atlas_indexes(tmp_path)
    _concept(tmp_path, "week", WEEK, period=7.1, cyclic=True, non_selective=[30, 31])
    _concept(tmp_path, "month", MONTH, period=11.8, cyclic=True)
    _concept(tmp_path, "jumbled", NOT_CYCLIC, period=3.0, cyclic=False)
    write_analysis(tmp_path, "circular", "disc", parameters={}, extra={"type": "discovery", "sae_id": SAE},
                   tables={"main": pl.DataFrame({"cluster_id": [4], "features": [CLUSTER], "score": [0.7]})})
    latents = np.arange(N_LATENTS)
    write_analysis(tmp_path, "lobes", "lobes", parameters={"sae_id": SAE},
                   tables={"main": pl.DataFrame({"latent": latents, "lobe": latents % 4, "geometric": latents % 3})})
    return tmp_path


def _found(root, filters):
    query = np.ones(16, dtype=np.float32)
    return {m.latent for m in FeatureSearch(root).by_vector(query, k=N_LATENTS, sae_id=SAE, filters=filters)}


def test_geometry_filters_return_exactly_the_planted_members(planted):
    counts = rebuild_geometry_records(planted)
    assert counts == {SAE: len(WEEK) + len(MONTH) + len(NOT_CYCLIC) + len(CLUSTER) + N_LATENTS}
    assert _found(planted, Filters(in_circle=True, period=7)) == set(WEEK)
    assert _found(planted, Filters(period=12)) == set(MONTH)
    assert _found(planted, Filters(in_circle=True)) == set(WEEK + MONTH + CLUSTER)
    assert _found(planted, Filters(in_circle=False)) == set(range(N_LATENTS)) - set(WEEK + MONTH + CLUSTER)
    assert _found(planted, Filters(lobe=3)) == {i for i in range(N_LATENTS) if i % 4 == 3}
    assert _found(planted, Filters(lobe=3, in_circle=True, period=7)) == {i for i in WEEK if i % 4 == 3}
    records = read_records(planted, SAE, "geometry").filter(pl.col("latent") == WEEK[0]).to_dicts()
    assert {(r["kind"], r["run"]) for r in records} == {("concept", "week"), ("lobe", "lobes")}
    week = next(r for r in records if r["kind"] == "concept")
    assert week["in_circle"] and week["period"] == pytest.approx(7.1) and week["group"] == 0


def test_records_are_empty_before_a_build_and_damage_is_named(planted):
    assert read_records(planted, SAE, "geometry").height == 0
    assert _found(planted, Filters(in_circle=True)) == set()
    rebuild_geometry_records(planted)
    path, _ = record_paths(planted, SAE, "geometry")
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(IntegrityError, match="geometry.parquet"):
        read_records(planted, SAE, "geometry")


def test_atlas_vector_search_takes_the_geometry_filters(planted):
    from sae_atlas import Atlas
    from sae_atlas.store.layout import AtlasLayout

    layout = AtlasLayout(planted)
    if not layout.atlas_json.exists():
        layout.atlas_json.write_text('{"schema_version": 1, "saes": {}}')
    rebuild_geometry_records(planted)
    atlas = Atlas(planted)
    hits = atlas.search_vector(np.ones(16), k=N_LATENTS, in_circle=True, period=7)
    assert set(hits["latent"].to_list()) == set(WEEK)
    assert set(atlas.geometry_features(SAE, lobe=3, kind="lobe")["latent"].to_list()) == {
        i for i in range(N_LATENTS) if i % 4 == 3}
