"""Files that are each intact but do not belong together (issue: "consistent but foreign"):
every file derived from an SAE's weights records their sha256, and reading it beside other
weights is an IntegrityError naming the stale file and the command that rebuilds it. Files
written before the weights were recorded are read as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from sae_atlas.api.atlas import Atlas
from sae_atlas.errors import IntegrityError
from sae_atlas.saes.eval.evaluate import read_eval
from sae_atlas.saes.summary.run import summarize_sae
from sae_atlas.store.feature_records import read_records, write_records
from sae_atlas.store.index import build_atlas_indexes
from sae_atlas.store.integrity import WEIGHTS_SHA256, verify_sae_weights
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.search import FeatureSearch, Filters
from tests.api.small_atlas import HOOKS
from tests.store.corruption import (
    FEATURE,
    INDEX_FILES,
    LABEL_FILES,
    MAP_FILES,
    SAE0,
    SAE1,
    TABLE_FILES,
)

VECTOR = np.linspace(-1.0, 1.0, 32, dtype=np.float32)


def _copy_from_healthy(root: Path, names: tuple[str, ...]) -> None:
    for name in names:
        shutil.copyfile(root / "saes" / SAE0 / name, root / "saes" / SAE1 / name)


def _stale(info: pytest.ExceptionInfo[IntegrityError], root: Path, name: str, repair: str) -> None:
    """The error names SAE1's file `name` as derived from other weights, and `repair`."""
    assert info.value.path == str(root / "saes" / SAE1 / name)
    assert "derived from other weights" in info.value.problem
    assert repair in info.value.repair


def test_summary_tables_of_another_sae_are_refused_and_summarize_replaces_them(atlas_copy: Path) -> None:
    _copy_from_healthy(atlas_copy, TABLE_FILES)  # same d_sae: before, SAE0's statistics were served as SAE1's
    with pytest.raises(IntegrityError) as info:
        Atlas(atlas_copy).feature(SAE1, 0)
    _stale(info, atlas_copy, "tables.json", f"sae-atlas summarize {atlas_copy} --sae {SAE1}")
    with pytest.raises(IntegrityError, match="tables.json: stale"):
        FeatureSearch(atlas_copy).similar(SAE1, FEATURE, filters=Filters(exclude_dead=True))  # density filter
    report = summarize_sae(atlas_copy, SAE1, top_k=8, window=(6, 2), progress=False)  # the repair, as written
    assert not report.skipped
    assert json.loads((AtlasLayout(atlas_copy).sae_dir(SAE1) / "tables.json").read_text())[WEIGHTS_SHA256] == (
        verify_sae_weights(atlas_copy, SAE1))
    assert Atlas(atlas_copy).feature(SAE1, 0).sae_id == SAE1


def test_a_map_of_another_sae_is_refused(atlas_copy: Path) -> None:
    _copy_from_healthy(atlas_copy, MAP_FILES)
    with pytest.raises(IntegrityError) as info:
        Atlas(atlas_copy).map(SAE1)
    _stale(info, atlas_copy, "map.parquet", f"sae-atlas analyze map {atlas_copy} --sae {SAE1}")


def test_labels_of_another_sae_are_refused_but_a_rebuild_can_keep_their_imports(atlas_copy: Path) -> None:
    _copy_from_healthy(atlas_copy, LABEL_FILES)
    with pytest.raises(IntegrityError) as info:
        read_records(atlas_copy, SAE1, "labels")
    _stale(info, atlas_copy, "labels.parquet", f"sae-atlas search labels {atlas_copy} --rebuild")
    kept = read_records(atlas_copy, SAE1, "labels", check_weights=False)  # a rewrite reads what it replaces
    write_records(atlas_copy, SAE1, "labels", kept)
    assert read_records(atlas_copy, SAE1, "labels").equals(kept)


def test_swapped_weights_name_the_sae_whose_derived_files_are_stale(atlas_copy: Path) -> None:
    _copy_from_healthy(atlas_copy, ("sae_weights.safetensors", "cfg.json"))  # same shape, each file intact
    with pytest.raises(IntegrityError) as info:
        Atlas(atlas_copy).search_vector(VECTOR, k=5)  # before: a stale indexes/model.faiss
    _stale(info, atlas_copy, "index.faiss", f"sae-atlas index {atlas_copy} --rebuild")
    with pytest.raises(IntegrityError) as info:
        Atlas(atlas_copy).feature(SAE1, FEATURE)
    _stale(info, atlas_copy, "tables.json", f"sae-atlas summarize {atlas_copy} --sae {SAE1}")
    from sae_atlas.api.http import ServerSettings, create_app

    with TestClient(create_app(ServerSettings(root=atlas_copy)), raise_server_exceptions=False) as client:
        answer = client.post("/search/vector", json={"vector": VECTOR.tolist(), "k": 5})
        page = client.get(f"/saes/{SAE1}/features/{FEATURE}")
    assert answer.status_code >= 500 and f"saes/{SAE1}/index.faiss" in answer.text
    assert "derived from other weights" in answer.text and "model.faiss" not in answer.text
    assert page.status_code >= 500 and f"saes/{SAE1}/" in page.text and "derived from other weights" in page.text
    build_atlas_indexes(atlas_copy, rebuild=True)  # the repair the search named: it then names the next stale file
    with pytest.raises(IntegrityError) as info:
        Atlas(atlas_copy).search_vector(VECTOR, k=5)
    _stale(info, atlas_copy, "labels.parquet", f"sae-atlas search labels {atlas_copy} --rebuild")


def test_an_index_of_another_sae_is_refused(atlas_copy: Path) -> None:
    _copy_from_healthy(atlas_copy, INDEX_FILES)
    with pytest.raises(IntegrityError, match=f"{SAE1}/index.faiss: index is stale"):
        Atlas(atlas_copy).similar(SAE1, FEATURE, k=5)


def test_sidecars_written_before_weights_were_recorded_are_read_as_before(atlas_copy: Path) -> None:
    before = Atlas(atlas_copy)
    page, table = before.feature(SAE1, FEATURE).to_dict(), before.map(SAE1)
    folder = AtlasLayout(atlas_copy).sae_dir(SAE1)
    for sidecar in ("tables.json", "map.json", "labels.json", "eval.json"):
        record = json.loads((folder / sidecar).read_text())
        assert WEIGHTS_SHA256 in record  # new writes always record the weights
        del record[WEIGHTS_SHA256]
        (folder / sidecar).write_text(json.dumps(record))
    after = Atlas(atlas_copy)
    assert after.feature(SAE1, FEATURE).to_dict() == page and after.map(SAE1) == table
    assert read_eval(atlas_copy, SAE1)["metrics"]


def test_eval_results_are_checked_against_their_weights_and_activations(atlas_copy: Path) -> None:
    assert read_eval(atlas_copy, SAE1)["parameters"]["sae_id"] == SAE1
    _copy_from_healthy(atlas_copy, ("eval.json",))
    with pytest.raises(IntegrityError) as info:
        read_eval(atlas_copy, SAE1)
    _stale(info, atlas_copy, "eval.json", f"sae-atlas eval {atlas_copy} --sae {SAE1}")
    manifest = AtlasLayout(atlas_copy).activation_dir(HOOKS[0]) / "manifest.json"
    recorded = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**recorded, "note": "re-cached"}))  # another cache of the same hook
    with pytest.raises(IntegrityError, match="eval.json: stale: computed on another activation cache"):
        read_eval(atlas_copy, SAE0)
