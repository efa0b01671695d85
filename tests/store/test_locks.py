"""File locks between writers and readers of an atlas (`store.locks`), and what they make
safe: an index build still running is not taken for an interrupted one, and an index is
loaded whole while `save_index` replaces it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import sae_atlas.store.index as index_module
from sae_atlas.errors import IntegrityError
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.index import (
    build_atlas_indexes,
    build_index,
    build_lock_path,
    build_marker_path,
    check_build_complete,
    index_lock_path,
    load_index,
    sae_index_path,
)
from sae_atlas.store.locks import file_lock
from sae_atlas.store.search import FeatureSearch
from tests.store.lock_holder import held_elsewhere
from tests.store.sae_folders import write_sae


def test_lock_modes_waits_and_reentry(tmp_path: Path) -> None:
    lock = tmp_path / ".x.lock"
    with held_elsewhere(lock, "shared"):
        with file_lock(lock, "shared", wait=0) as got:
            assert got  # readers share
        with file_lock(lock, "exclusive", wait=0.1) as got:
            assert not got  # a writer waits for the readers, here at most 0.1 s
    with held_elsewhere(lock, "exclusive"):
        started = time.monotonic()
        with file_lock(lock, "shared", wait=0) as got:
            assert not got and time.monotonic() - started < 1  # a reader that must not block does not
    with file_lock(lock, "exclusive") as got:
        assert got
        with file_lock(lock, "shared", wait=0) as again:
            assert again  # the thread holding it takes it again
    with file_lock(lock, "shared"), pytest.raises(RuntimeError, match="cannot take it exclusively"):
        with file_lock(lock, "exclusive"):
            pass


def test_a_killed_process_releases_its_lock(tmp_path: Path) -> None:
    lock = tmp_path / ".x.lock"
    code = ("import sys, time; from sae_atlas.store.locks import file_lock\n"
            "with file_lock(sys.argv[1], 'exclusive'):\n    print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with file_lock(lock, "shared", wait=0) as got:
            assert not got
    finally:
        proc.kill()
        proc.wait()
    with file_lock(lock, "shared", wait=0) as got:
        assert got


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    for layer, sae_id in enumerate(("a", "b")):
        write_sae(tmp_path, sae_id, rng.standard_normal((40, 8)).astype(np.float32), f"blocks.{layer}.hook_resid_post")
    build_atlas_indexes(tmp_path)
    return tmp_path


def test_a_running_build_is_not_an_interrupted_one(indexed: Path) -> None:
    def start_build() -> None:  # as build_atlas_indexes does first, then it rewrites the indexes
        build_marker_path(indexed).write_text('{"approx_threshold": 32}')

    with held_elsewhere(build_lock_path(indexed), during=start_build):
        check_build_complete(indexed)  # the builder is alive: not an error, and no waiting
        search = FeatureSearch(indexed)  # a model-wide search made for the first time meanwhile
        hits = search.by_vector(search.decoder_row("a", 3), k=1)
        assert (hits[0].sae_id, hits[0].latent) == ("a", 3)
    with pytest.raises(IntegrityError, match="interrupted") as info:  # the builder is gone, its marker left
        check_build_complete(indexed)
    assert "--approx-threshold 32" in info.value.repair
    build_atlas_indexes(indexed)
    check_build_complete(indexed)


def test_the_build_holds_its_lock_until_done(indexed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bool, bool]] = []  # (lock free, build taken for interrupted)
    save_index = index_module.save_index

    def watched(*args: object, **kwargs: object) -> None:
        def probe() -> None:  # another process's view, mid-build
            with file_lock(build_lock_path(indexed), "shared", wait=0) as free:
                pass
            try:
                check_build_complete(indexed)
                seen.append((free, False))
            except IntegrityError:
                seen.append((free, True))

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join(30)
        save_index(*args, **kwargs)

    monkeypatch.setattr(index_module, "save_index", watched)
    build_atlas_indexes(indexed, rebuild=True)
    assert seen and set(seen) == {(False, False)}  # held at every index it wrote; never "interrupted"
    assert not build_marker_path(indexed).exists()


def test_load_waits_for_a_save_in_progress_and_reads_one_whole_pair(indexed: Path) -> None:
    path = sae_index_path(indexed, "a")
    rows = unit_rows(np.random.default_rng(1).standard_normal((40, 8)).astype(np.float32))
    new, info = build_index(rows)
    sidecar = path.with_suffix(".json")
    old_sidecar = sidecar.read_text()
    loaded: list[object] = []

    def load() -> None:
        try:
            loaded.append(load_index(path, indexed, {}))
        except Exception as exc:  # noqa: BLE001 (recorded for the assertion)
            loaded.append(exc)

    with held_elsewhere(index_lock_path(path), "exclusive"):
        index_module.save_index(new, info, path.with_name("staged.faiss"), {})
        path.with_name("staged.faiss").replace(path)  # the new index is in place, its sidecar not yet
        reader = threading.Thread(target=load)
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not loaded  # the reader waits instead of failing on a torn pair
        assert sidecar.read_text() == old_sidecar
        path.with_name("staged.json").replace(sidecar)
    reader.join(30)
    index, read_sidecar = loaded[0]
    assert read_sidecar["index_sha256"] != json.loads(old_sidecar)["index_sha256"]
    assert index.search(rows[:1], 1)[1][0, 0] == 0


def test_load_waits_a_bounded_time(indexed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sae_index_path(indexed, "a")
    monkeypatch.setattr(index_module, "INDEX_LOCK_WAIT", 0.2)
    with held_elsewhere(index_lock_path(path), "exclusive"):  # a writer that does not finish
        started = time.monotonic()
        index, _ = load_index(path, indexed, {})  # the pair is whole: read after the wait
        assert index.ntotal == 40 and 0.2 <= time.monotonic() - started < 5

