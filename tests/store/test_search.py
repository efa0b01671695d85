"""Feature search: density providers, cross-layer flow across widths, memory-mapped loading,
and the approximate path through the atlas (forced by a small threshold)."""

import json

import numpy as np
import pytest

import sae_atlas.store.search as search_module
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.index import build_atlas_indexes, load_index, model_index_path, sae_index_path
from sae_atlas.store.neighbour_tables import TABLE_K
from sae_atlas.store.search import FeatureSearch, Filters, matches_frame
from tests.store.sae_folders import write_sae


@pytest.fixture
def layered(tmp_path):
    """Three SAEs at layers 0, 2, 5 sharing one planted direction, plus an SAE of other width."""
    rng = np.random.default_rng(3)
    direction = rng.standard_normal(16).astype(np.float32)
    planted = {"l0": 11, "l2": 4, "l5": 60}
    for layer, (sae_id, latent) in enumerate(planted.items()):
        rows = rng.standard_normal((80, 16)).astype(np.float32)
        rows[latent] = direction * (layer + 1) + 0.05 * rng.standard_normal(16)
        write_sae(tmp_path, sae_id, rows, f"blocks.{[0, 2, 5][layer]}.hook_resid_post")
    write_sae(tmp_path, "attn", rng.standard_normal((40, 8)).astype(np.float32), "blocks.1.attn.hook_z")
    (tmp_path / "atlas.json").write_text(json.dumps({"model": "planted"}))  # what `cache` writes first
    build_atlas_indexes(tmp_path)
    return tmp_path, planted


def test_flow_follows_a_direction_through_layers_and_skips_other_widths(layered):
    root, planted = layered
    search = FeatureSearch(root)
    flow = search.flow("l0", planted["l0"])
    assert [(m.sae_id, m.latent, m.layer) for m in flow] == [("l2", 4, 2), ("l5", 60, 5)]
    assert all(m.cosine > 0.95 for m in flow)
    assert [m.sae_id for m in search.flow("l0", planted["l0"], filters=Filters(layers=(5,)))] == ["l5"]
    two = search.flow("l2", 4, k=2)
    assert [(m.sae_id, m.rank) for m in two] == [("l0", 0), ("l0", 1), ("l5", 0), ("l5", 1)]
    assert two[0].latent == 11 and two[2].latent == 60
    frame = matches_frame(flow)
    assert frame.columns == ["sae_id", "latent", "cosine", "rank", "layer"]
    assert frame["latent"].to_list() == [4, 60]


def test_density_provider_mapping_and_callable(layered):
    root, planted = layered
    density = np.full(80, 0.02)
    density[planted["l0"]] = 0.0  # dead: must vanish from every filtered result
    density[:40] = 0.3
    density[planted["l0"]] = 0.0
    for provider in ({"l0": density}, lambda sae_id: density if sae_id == "l0" else None):
        search = FeatureSearch(root, densities=provider)
        vector = search.decoder_row("l0", planted["l0"])
        hits = search.by_vector(vector, k=10, sae_id="l0", filters=Filters(exclude_dead=True, min_density=0.1))
        assert len(hits) == 10 and all(m.latent < 40 and m.latent != planted["l0"] for m in hits)
        assert search.by_vector(vector, k=1, sae_id="l0")[0].latent == planted["l0"]  # unfiltered
    with pytest.raises(InvalidInputError, match="have 3 entries; it has 80 latents"):
        FeatureSearch(root, densities={"l0": np.zeros(3)}).similar("l0", 0, filters=Filters(exclude_dead=True))


def test_indexes_load_memory_mapped(layered):
    root, _ = layered
    index, sidecar = load_index(sae_index_path(root, "l0"), root, {})
    assert sidecar["type"] == "IndexFlatIP" and sidecar["mmap"] is True and index.ntotal == 80


def test_approximate_path_through_the_atlas(tmp_path):
    rng = np.random.default_rng(5)
    centres = unit_rows(rng.standard_normal((40, 32)))
    rows = unit_rows(centres[rng.integers(0, 40, 6000)] + 0.25 * rng.standard_normal((6000, 32)))
    rows[123] = rows[4000] * 2.0 + 0.003 * rng.standard_normal(32)  # planted near-duplicate
    write_sae(tmp_path, "big", rows * rng.uniform(0.5, 3.0, (6000, 1)), "blocks.3.hook_resid_post")
    infos = build_atlas_indexes(tmp_path, approx_threshold=1000)
    assert {i["type"] for i in infos} == {"IndexRefineFlat(IndexIVFPQFastScan)"} and len(infos) == 2
    sidecar = json.loads(sae_index_path(tmp_path, "big").with_suffix(".json").read_text())
    assert sidecar["recall_at_10"] >= 0.95 and sidecar["params"]["nprobe"] < sidecar["params"]["nlist"]
    assert model_index_path(tmp_path).exists()
    search = FeatureSearch(tmp_path)
    assert search.sae_index("big")[1]["mmap"] is True
    assert search.similar("big", 123, k=1)[0].latent == 4000
    unit = unit_rows(rows)
    queries = unit_rows(unit[:100] + 0.01 * rng.standard_normal((100, 32)))
    truth = np.argsort(-queries @ unit.T, axis=1)[:, :10]
    found = [[m.latent for m in search.by_vector(q, k=10, sae_id="big")] for q in queries]
    recall = np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth.tolist(), found, strict=True)])
    assert recall >= sidecar["recall_at_10"] - 0.05
    hit = search.by_vector(rows[77] * 9.0, k=1, sae_id="big")[0]
    assert hit.latent == 77 and hit.cosine == pytest.approx(1.0, abs=1e-5)


def test_model_index_covers_the_common_width_and_excludes_others(layered):
    root, planted = layered
    sidecar = json.loads(model_index_path(root).with_suffix(".json").read_text())
    assert [s["sae_id"] for s in sidecar["saes"]] == ["l0", "l2", "l5"]
    assert sidecar["excluded"] == [{"sae_id": "attn", "d": 8}]
    search = FeatureSearch(root)
    across = search.similar("l0", planted["l0"], k=2, across_saes=True)
    assert {(m.sae_id, m.latent) for m in across} == {("l2", 4), ("l5", 60)}
    assert search.by_vector(np.ones(8), k=3, sae_id="attn")[0].sae_id == "attn"


def test_index_cli_keeps_current_and_repairs_corrupt(layered):
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    root, _ = layered
    runner = CliRunner()
    first = runner.invoke(app, ["index", str(root), "--json"])
    assert first.exit_code == 0, first.output
    assert not any(info["rebuilt"] for info in json.loads(first.output))
    path = sae_index_path(root, "l2")
    path.write_bytes(path.read_bytes()[:100])
    broken = runner.invoke(app, ["index", str(root), "--sae", "l2", "--json"])
    assert [(i.get("sae_id", "model"), i["rebuilt"]) for i in json.loads(broken.output)] == [("l2", True), ("model", False)]
    repaired = FeatureSearch(root)
    assert repaired.by_vector(repaired.decoder_row("l2", 4), k=1, sae_id="l2")[0].latent == 4
    again = runner.invoke(app, ["index", str(root), "--rebuild", "--approx-threshold", "50", "--json"])
    infos = json.loads(again.output)
    assert all(i["rebuilt"] for i in infos)
    assert {i.get("sae_id", "model"): i["type"] for i in infos} == {
        "attn": "IndexFlatIP", "l0": "IndexRefineFlat(IndexIVFPQFastScan)", "l2": "IndexRefineFlat(IndexIVFPQFastScan)", "l5": "IndexRefineFlat(IndexIVFPQFastScan)", "model": "IndexRefineFlat(IndexIVFPQFastScan)"}


def _same(a, b) -> bool:
    """Equal match lists up to float rounding of the cosines."""
    return ([(m.sae_id, m.latent, m.rank, m.layer) for m in a] == [(m.sae_id, m.latent, m.rank, m.layer) for m in b]
            and np.allclose([m.cosine for m in a], [m.cosine for m in b], atol=1e-6))


def test_neighbour_tables_answer_like_the_index(layered, monkeypatch):
    root, planted = layered
    search = FeatureSearch(root)
    via_table = [search.similar("l0", i, k=10) for i in range(80)]
    flows = [search.flow("l2", i, k=3) for i in range(80)]
    assert search.neighbour_table("l0", "l0")[0].shape == (80, TABLE_K)
    monkeypatch.setattr(search_module, "TABLE_MAX_PAIRS", 0)  # no tables: every lookup hits the index
    direct = FeatureSearch(root)
    assert direct.neighbour_table("l0", "l0") is None
    assert all(_same(a, direct.similar("l0", i, k=10)) for i, a in enumerate(via_table))
    assert all(_same(a, direct.flow("l2", i, k=3)) for i, a in enumerate(flows))
    assert all(m.latent != 7 for m in via_table[7]) and [m.rank for m in via_table[7]] == list(range(10))
    wide = search.similar("l0", 5, k=40)  # more than a table row holds: from the index
    assert len(wide) == 40 and _same(wide[:10], via_table[5])
    assert _same(search.flow("l0", planted["l0"], k=1), direct.flow("l0", planted["l0"], k=1))
