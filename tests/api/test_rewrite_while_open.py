"""An open atlas (a running server's) follows files rewritten under it: after `sae-atlas
summarize` rewrites an SAE's summary tables and labels, its feature pages are those of a
freshly opened atlas, not the old statistics beside the new labels."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from api import Atlas
from api.context import ResourceCache
from store.feature_records import read_records, write_records
from store.tables import write_tables


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
