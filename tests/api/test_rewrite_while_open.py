"""An open atlas (a running server's) follows files rewritten under it: after `sae-atlas
summarize` rewrites an SAE's summary tables and labels, its feature pages are those of a
freshly opened atlas, not the old statistics beside the new labels; while the rewrite is
under way it answers with the summary it read before, and a rewrite killed half-way is
named as damage, never served as a mix. An index build under way is not taken for an
interrupted one."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import sae_atlas.store.tables as tables_module
from sae_atlas import Atlas
from sae_atlas.api.context import ResourceCache
from sae_atlas.errors import IntegrityError
from sae_atlas.store.feature_records import read_records, write_records
from sae_atlas.store.index import build_lock_path, build_marker_path
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.locks import TABLES_LOCK_FILE
from sae_atlas.store.tables import FeatureTables, write_tables
from tests.store.lock_holder import held_elsewhere


def test_feature_page_follows_a_rewritten_summary(small_atlas: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(small_atlas["root"], root)
    sae_id = small_atlas["sae_ids"][0]
    atlas = Atlas(root)
    atlas.preload()
    before = atlas.feature(sae_id, 0)

    tables = atlas.sae(sae_id).tables()  # rewritten as summarize does: the tables, then the labels
    write_tables(root, sae_id, tables.features.with_columns(pl.col("mean_act") * 2 + 1), tables.examples,
                 tables.params)
    labels = read_records(root, sae_id, "labels")
    write_records(root, sae_id, "labels", pl.concat([
        labels.filter(pl.col("latent") != 0),
        pl.DataFrame({"sae_id": [sae_id], "latent": [0], "source": ["auto"], "text": ["rewritten"]},
                     schema=labels.schema)]))

    after = atlas.feature(sae_id, 0)
    assert after.stats["mean_act"] == pytest.approx(2 * before.stats["mean_act"] + 1)
    assert after.label == "rewritten"
    assert after == Atlas(root).feature(sae_id, 0)


@pytest.fixture
def opened(small_atlas: dict[str, Any], tmp_path: Path) -> tuple[Path, str, Atlas]:
    """A private copy of the small atlas, one SAE id, and the atlas opened and preloaded."""
    root = Path(shutil.copytree(small_atlas["root"], tmp_path / "atlas"))
    atlas = Atlas(root)
    atlas.preload()
    return root, small_atlas["sae_ids"][0], atlas


def resummarize(root: Path, sae_id: str) -> None:
    """Rewrite the SAE's summary as `sae-atlas summarize` does: tables and offline labels in
    one write (here: mean activations 2x+1, latent 0 labelled "rewritten")."""
    tables = FeatureTables(root, sae_id)
    labels = read_records(root, sae_id, "labels").filter(pl.col("source") == "auto").select("latent", "text")
    write_tables(root, sae_id, tables.features.with_columns(pl.col("mean_act") * 2 + 1), tables.examples,
                 tables.params, labels=labels.with_columns(
                     pl.when(pl.col("latent") == 0).then(pl.lit("rewritten")).otherwise(pl.col("text")).alias("text")))


def summary_lock(root: Path, sae_id: str) -> Path:
    return AtlasLayout(root).sae_dir(sae_id) / TABLES_LOCK_FILE


def test_pages_keep_the_summary_they_read_while_it_is_rewritten(opened: tuple[Path, str, Atlas]) -> None:
    root, sae_id, atlas = opened
    before = atlas.feature(sae_id, 0)
    with held_elsewhere(summary_lock(root, sae_id), during=lambda: resummarize(root, sae_id)):
        started = time.monotonic()
        during = atlas.feature(sae_id, 0)  # the new files are there, the writer still holds the lock
        assert time.monotonic() - started < 5  # answered from the pair read before, without waiting
        assert (during.stats, during.label) == (before.stats, before.label)
    after = atlas.feature(sae_id, 0)
    assert after.stats["mean_act"] == pytest.approx(2 * before.stats["mean_act"] + 1)
    assert after.label == "rewritten"
    assert after == Atlas(root).feature(sae_id, 0)


def test_one_view_reads_one_summary(opened: tuple[Path, str, Atlas]) -> None:
    root, sae_id, atlas = opened
    view = atlas.sae(sae_id)
    mean = view.tables().feature(0)["mean_act"]
    resummarize(root, sae_id)  # between two reads of one page
    assert view.labels_by_latent().filter(pl.col("latent") == 0)["label"].item() != "rewritten"
    assert view.tables().feature(0)["mean_act"] == mean
    assert atlas.sae(sae_id).labels_by_latent().filter(pl.col("latent") == 0)["label"].item() == "rewritten"


def test_a_summary_killed_before_its_sidecar_is_damage_not_a_mix(opened: tuple[Path, str, Atlas],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root, sae_id, atlas = opened
    before = atlas.feature(sae_id, 0)

    def killed(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tables_module, "atomic_write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        resummarize(root, sae_id)
    monkeypatch.undo()
    assert read_records(root, sae_id, "labels").filter(pl.col("latent") == 0)["text"][0] == "rewritten"
    for reader in (atlas, Atlas(root)):  # the server that was running, and one started now
        with pytest.raises(IntegrityError, match="sha256 does not match tables.json") as info:
            reader.feature(sae_id, 0)
        assert "sae-atlas summarize" in info.value.repair
    assert before.label != "rewritten"


@pytest.mark.parametrize("write", ["build", "import"])
def test_label_writes_wait_for_the_summary_lock(opened: tuple[Path, str, Atlas], tmp_path: Path, write: str) -> None:
    root, sae_id, atlas = opened
    (tmp_path / "mine.csv").write_text("feature,explanation\n1,an imported explanation\n")
    run = {"build": lambda: atlas.build_labels([sae_id]),
           "import": lambda: atlas.import_explanations(sae_id, tmp_path / "mine.csv")}[write]
    version = atlas.sae(sae_id).labels_version()
    with held_elsewhere(summary_lock(root, sae_id)):
        writer = threading.Thread(target=run)
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and atlas.sae(sae_id).labels_version() == version
    writer.join(30)
    assert atlas.sae(sae_id).labels_version() != version


def test_density_filters_follow_rewritten_tables(opened: tuple[Path, str, Atlas]) -> None:
    root, sae_id, atlas = opened
    search = atlas.ctx.search()
    density = search.density(sae_id).copy()
    tables = FeatureTables(root, sae_id)
    write_tables(root, sae_id, tables.features.with_columns(pl.col("density") / 2), tables.examples, tables.params)
    assert search.density(sae_id) == pytest.approx(density / 2)


def test_an_index_build_under_way_is_not_damage(opened: tuple[Path, str, Atlas]) -> None:
    root, sae_id, _ = opened

    def start_build() -> None:
        build_marker_path(root).write_text('{"approx_threshold": 200000}')

    with held_elsewhere(build_lock_path(root), during=start_build):
        started = Atlas(root)  # a server started during the rebuild
        assert started.damaged() == {}
        assert len(started.search_vector(started.ctx.search().decoder_row(sae_id, 0), k=3))
    assert set(Atlas(root).damaged()) == set(started.sae_ids)  # the build was killed: every SAE names it


def test_resource_cache_keeps_the_current_version_only() -> None:
    cache = ResourceCache()
    loads: list[str] = []

    def load(text: str) -> str:
        loads.append(text)
        return text

    assert cache.current(("t",), 1, lambda: load("one")) == "one"
    assert cache.current(("t",), 1, lambda: load("again")) == "one"
    assert cache.current(("t",), 2, lambda: load("two")) == "two"
    assert cache.current(("t",), 1, lambda: load("one back")) == "one back"  # the old copy was dropped
    assert loads == ["one", "two", "one back"]
