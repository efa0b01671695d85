"""Integrity on every path (issue 17): weights checksums before indexing, registered SAEs
without files, half-written training and summaries (states constructed, not waited for),
interrupted index builds, and a server that keeps serving the healthy SAEs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from starlette.testclient import TestClient

from sae_atlas.api.atlas import Atlas
from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.atomic import sha256_file
from sae_atlas.store.index import (
    build_atlas_indexes,
    build_marker_path,
    read_decoder,
    sae_index_path,
)
from sae_atlas.store.integrity import cached_sha256
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.search import FeatureSearch
from sae_atlas.store.tables import (
    EXAMPLES_FILE,
    FEATURES_FILE,
    FeatureTables,
    read_sidecar,
    read_table,
    write_tables,
)
from tests.api.small_atlas import HOOKS
from tests.store.corruption import SAE0, SAE1, damage

WEIGHTS = "sae_weights.safetensors"


class Killed(BaseException):
    """Stands for a kill -9 at a chosen point of a write."""


def _train(root: Path, hooks: list[str], **overrides: object) -> dict:
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.train_saes import train_saes

    options = {"architecture": "topk", "d_sae": 64, "k": 4, **overrides}
    return train_saes(root, hooks, train_cfg=TrainConfig(total_tokens=256 * 20, batch_size=256, progress=False),
                      **options)


# 1. weights checksum -----------------------------------------------------------------------
def test_corrupt_weights_are_named_before_any_index_is_used_or_rebuilt(atlas_copy: Path) -> None:
    weights = AtlasLayout(atlas_copy).sae_dir(SAE1) / WEIGHTS
    index_before = sae_index_path(atlas_copy, SAE1).read_bytes()
    damage(weights, "flip")
    for read in (lambda: read_decoder(atlas_copy, SAE1), lambda: Atlas(atlas_copy).feature(SAE1, 3),
                 lambda: build_atlas_indexes(atlas_copy, rebuild=True)):
        with pytest.raises(IntegrityError, match="sha256 does not match") as info:
            read()
        assert info.value.path == str(weights) and "re-train" in info.value.repair
    assert sae_index_path(atlas_copy, SAE1).read_bytes() == index_before  # nothing rewritten
    assert not build_marker_path(atlas_copy).exists()  # refused before the build started


def test_checksum_cache_sees_a_rewritten_file(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 100)
    first = cached_sha256(path)
    assert cached_sha256(path) == first == sha256_file(path)
    path.write_bytes(b"b" * 100)  # same size, new mtime
    assert cached_sha256(path) == sha256_file(path) != first


# 2. registered SAE without files -----------------------------------------------------------
def test_registered_sae_without_cfg_is_an_integrity_error_not_an_omission(atlas_copy: Path) -> None:
    cfg = AtlasLayout(atlas_copy).sae_dir(SAE1) / "cfg.json"
    cfg.unlink()
    layout = AtlasLayout(atlas_copy)
    assert SAE1 in layout.sae_ids()
    with pytest.raises(IntegrityError, match="registered in atlas.json") as info:
        layout.require_sae(SAE1)
    assert info.value.path == str(cfg)
    atlas = Atlas(atlas_copy)
    for query in (lambda: atlas.search_token(5), lambda: atlas.flow(SAE0, 3),
                  lambda: atlas.search_vector(np.ones(32))):
        with pytest.raises(IntegrityError, match=SAE1):
            query()
    assert atlas.search_token(5, sae_id=SAE0).token_id == 5  # the healthy SAE on its own still answers


# 3. a sidecar without its file -------------------------------------------------------------
@pytest.mark.parametrize("name", ["index.faiss", "map.parquet"])
def test_sidecar_without_its_file_is_an_error_not_an_empty_field(atlas_copy: Path, name: str) -> None:
    missing = AtlasLayout(atlas_copy).sae_dir(SAE1) / name
    missing.unlink()
    with pytest.raises(IntegrityError) as info:
        Atlas(atlas_copy).feature(SAE1, 3)
    assert info.value.path == str(missing)


# 5. a save killed between cfg.json and training.json -------------------------------------
def test_train_finishes_a_save_killed_between_cfg_and_training_json(atlas_copy: Path, battery_atlas: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import sae_atlas.saes.train.trainer as trainer

    folder = AtlasLayout(atlas_copy).sae_dir(SAE0)
    original = sha256_file(AtlasLayout(battery_atlas).sae_dir(SAE0) / WEIGHTS)

    def killed(*_: object) -> None:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(trainer, "_write_record", killed)
        with pytest.raises(Killed):
            _train(atlas_copy, [HOOKS[0]], overwrite=True)
    assert (folder / "cfg.json").exists() and not (folder / "training.json").exists()
    assert list((folder / "checkpoints").iterdir())  # the run's checkpoints survive the kill

    result = _train(atlas_copy, [HOOKS[0]])  # the same configuration: resumes and finishes the save
    assert json.loads((folder / "training.json").read_text())["status"] == "complete"
    assert not (folder / "checkpoints").exists()
    assert sha256_file(folder / WEIGHTS) == original  # identical to the uninterrupted run
    assert result[HOOKS[0]]["sae_id"] == SAE0

    (folder / "training.json").unlink()  # a lost record, no checkpoints left: trains again
    _train(atlas_copy, [HOOKS[0]])
    assert sha256_file(folder / WEIGHTS) == original

    (folder / "training.json").unlink()
    with pytest.raises(InvalidInputError, match="differs in sae_config.k"):
        _train(atlas_copy, [HOOKS[0]], k=8)


# 6. missing activation manifest --------------------------------------------------------------
def test_missing_manifest_names_the_file_and_the_repair(atlas_copy: Path) -> None:
    manifest = AtlasLayout(atlas_copy).activation_dir(HOOKS[0]) / "manifest.json"
    manifest.unlink()
    with pytest.raises(IntegrityError, match="sae-atlas cache") as info:
        ActivationReader(atlas_copy, HOOKS[0])
    assert info.value.path == str(manifest)
    with pytest.raises(IntegrityError, match="manifest.json"):
        _train(atlas_copy, [HOOKS[0]])


def test_deleted_weights_in_search_vector_are_the_projects_error(atlas_copy: Path) -> None:
    (AtlasLayout(atlas_copy).sae_dir(SAE1) / WEIGHTS).unlink()
    with pytest.raises(IntegrityError, match="file is missing"):
        Atlas(atlas_copy).search_vector(np.ones(32))


# 7. readers during summarize -------------------------------------------------------------
def test_a_reader_during_a_summary_write_sees_the_old_or_the_new_summary_whole(
        atlas_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader starts after the writer replaced features.parquet but before it wrote the
    new tables.json; it must wait for the write, then read the new summary."""
    import sae_atlas.store.tables as tables

    old = FeatureTables(atlas_copy, SAE1)
    features = old.features.with_columns(pl.col("max_act") * 2)
    seen: dict[str, object] = {}
    reader = threading.Thread(target=lambda: seen.update(result=_read_or_error(atlas_copy)))
    write_parquet = tables._write_parquet

    def write_then_read(frame: pl.DataFrame, path: Path, table: str) -> dict:
        done = write_parquet(frame, path, table)
        if table == "features" and not reader.is_alive() and "result" not in seen:
            reader.start()
            reader.join(timeout=0.5)
            seen["waited"] = reader.is_alive()  # blocked until the summary is whole
        return done

    monkeypatch.setattr(tables, "_write_parquet", write_then_read)
    new = write_tables(atlas_copy, SAE1, features, old.examples, {**old.params, "rewritten": True})
    reader.join(timeout=10)
    assert seen["waited"] is True
    assert isinstance(seen["result"], FeatureTables), seen["result"]
    assert seen["result"].sidecar["files"] == new["files"]
    assert seen["result"].features["max_act"].to_list() == features["max_act"].to_list()


def _read_or_error(root: Path) -> object:
    try:
        return FeatureTables(root, SAE1)
    except IntegrityError as exc:
        return exc


# 8. killed summarize, interrupted index builds ---------------------------------------------
def test_summarize_after_a_kill_removes_the_spool(atlas_copy: Path) -> None:
    from sae_atlas.saes.summary.run import summarize_sae

    folder = AtlasLayout(atlas_copy).sae_dir(SAE1)
    stale = [folder / ".occurrence-indices.abc123", folder / ".occurrence-data.abc123",
             folder / ".occurrence-rows.abc123", folder / ".pending-occurrence.npz",
             folder / ".features.parquet.xyz.tmp"]
    for path in stale:
        path.write_bytes(b"left by a killed run")
    before = read_sidecar(atlas_copy, SAE1)
    summarize_sae(atlas_copy, SAE1, top_k=8, window=(6, 2), progress=False, force=True)
    assert not [p for p in stale if p.exists()]
    assert not [p.name for p in folder.iterdir() if p.name.startswith((".occurrence-", ".pending-"))]
    after = read_sidecar(atlas_copy, SAE1)
    assert after["files"]["occurrence.npz"] == before["files"]["occurrence.npz"]  # same data, installed
    read_table(atlas_copy, SAE1, FEATURES_FILE)
    read_table(atlas_copy, SAE1, EXAMPLES_FILE)


def test_an_interrupted_index_build_is_refused_until_run_again(atlas_copy: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`index --rebuild --approx-threshold 32` killed after the first SAE: one IVF index
    beside flat ones. Readers refuse; the re-run finishes with one type everywhere."""
    import sae_atlas.store.index as index

    save_index = index.save_index
    calls = []

    def killed_after_one(*args: object, **kwargs: object) -> None:
        if calls:
            raise Killed
        calls.append(args)
        save_index(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(index, "save_index", killed_after_one)
        with pytest.raises(Killed):
            build_atlas_indexes(atlas_copy, rebuild=True, approx_threshold=32)
    types = {s: json.loads(sae_index_path(atlas_copy, s).with_suffix(".json").read_text())["type"]
             for s in (SAE0, SAE1)}
    assert types[SAE0] != types[SAE1]  # the mixed state
    with pytest.raises(IntegrityError, match="interrupted") as info:
        FeatureSearch(atlas_copy).similar(SAE1, 3)
    assert info.value.path == str(build_marker_path(atlas_copy)) and "--approx-threshold 32" in info.value.repair

    infos = build_atlas_indexes(atlas_copy, approx_threshold=32)  # no --rebuild needed
    assert [i["rebuilt"] for i in infos] == [False, True, True]  # SAE0 was already of the asked type
    assert {i["exact"] for i in infos} == {False}
    assert not build_marker_path(atlas_copy).exists()
    assert FeatureSearch(atlas_copy).similar(SAE1, 3, k=3)
    assert {i["exact"] for i in build_atlas_indexes(atlas_copy)} == {True}  # default threshold: flat again


# 9. a damaged SAE in a running server ------------------------------------------------------
def test_serve_keeps_serving_the_healthy_saes_and_reports_the_damaged_one(atlas_copy: Path) -> None:
    from sae_atlas.api.http import ServerSettings, create_app

    damage(AtlasLayout(atlas_copy).sae_dir(SAE1) / WEIGHTS, "flip")
    weights = f"saes/{SAE1}/{WEIGHTS}"
    with TestClient(create_app(ServerSettings(root=atlas_copy)), raise_server_exceptions=False) as client:
        health = client.get("/health").json()
        assert health["saes"] == 1 and weights in health["damaged_saes"][SAE1]
        saes = {row["sae_id"]: row for row in client.get("/saes").json()}
        assert saes[SAE0]["status"] == "ok" and saes[SAE0]["problem"] is None
        assert saes[SAE1]["status"] == "damaged" and weights in saes[SAE1]["problem"]
        assert "re-train" in saes[SAE1]["problem"] and saes[SAE1]["hook"] == HOOKS[1]
        page = client.get(f"/saes/{SAE0}/features/3")
        assert page.status_code == 200
        assert {m["sae_id"] for m in page.json()["cross_layer"]} <= {SAE0}
        assert weights in page.json()["damaged_saes"][SAE1]
        assert client.get(f"/saes/{SAE0}/features/3/similar").status_code == 200
        broken = client.get(f"/saes/{SAE1}/features/3")
        assert broken.status_code == 500 and broken.json()["path"] == weights
        everywhere = client.post("/search/vector", json={"vector": [1.0] * 32})
        assert everywhere.status_code == 500 and everywhere.json()["path"] == weights
