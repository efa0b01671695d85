"""Feature tables: schema round trip, integrity errors, occurrence matrix, lookups."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.store.atomic import atomic_write_json, sha256_file
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import (
    EXAMPLES_FILE,
    EXAMPLES_SCHEMA,
    FEATURES_FILE,
    FEATURES_SCHEMA,
    TABLES_FILE,
    FeatureTables,
    OccurrenceWriter,
    conform,
    histogram_edges,
    load_occurrence,
    padded_list,
    read_table,
    write_tables,
)
from tests.store.sae_folders import write_sae

F = 5
HOOK = "blocks.0.hook_resid_post"


def _features() -> pl.DataFrame:
    rows = []
    for i in range(F):
        dead = i == 4
        rows.append({
            "latent": i, "n_active": 0 if dead else 10 * i + 1, "density": 0.0 if dead else 0.1 * i,
            "mean_act": 0.5 * i, "mean_active_act": None if dead else 1.0 + i, "max_act": 2.0 * i,
            "quantiles": None if dead else [0.1 * i, 0.5 * i, 0.9 * i], "hist_top": 4.0,
            "hist_counts": [i, 0, 2 * i], "decoder_norm": 1.0,
            "top_logit_ids": [i, 7], "top_logit_values": [3.0, 0.5 + i],
            "top_logit_tokens": [f"t{i}", "t7"], "bottom_logit_ids": [9, 8],
            "bottom_logit_values": [-1.0, -0.5], "bottom_logit_tokens": ["t9", "t8"],
        })
    return pl.DataFrame(rows, schema=FEATURES_SCHEMA)


def _examples() -> pl.DataFrame:
    rows = []
    for latent in (3, 0, 1, 3):  # unsorted on purpose; latent 2 and 4 have none
        for rank in range(2):
            rows.append({
                "latent": latent, "kind": "top", "band": None, "band_lo": None, "band_hi": None,
                "rank": rank + (2 if len([r for r in rows if r["latent"] == latent]) >= 2 else 0),
                "act": 5.0 - rank + latent, "token_id": 11 if latent != 1 else 12, "block": 7, "pos": 3,
                "doc_id": 1, "centre": 1, "token_ids": [2, 11, 4], "acts": [0.0, 5.0, 1.0],
                "tokens": ["a", "b", "c"],
            })
    rows.append({
        "latent": 0, "kind": "band", "band": 1, "band_lo": 1.0, "band_hi": 2.0, "rank": 0, "act": 1.5,
        "token_id": 12, "block": 8, "pos": 0, "doc_id": 2, "centre": 0, "token_ids": [12],
        "acts": [1.5], "tokens": None,
    })
    return pl.DataFrame(rows, schema=EXAMPLES_SCHEMA)


def _write(root, sae_id: str = "sae-a") -> None:
    write_sae(root, sae_id, np.eye(F, dtype=np.float32), HOOK)
    occ = OccurrenceWriter(root, sae_id, F)
    occ.append(np.array([7, 8]), np.array([[1, 0, 0, 2, 0], [0, 0, 0, 0, 0]]))
    occ.finish()
    write_tables(root, sae_id, _features(), _examples(), {"top_k": 2, "n_tokens": 100})


def test_round_trip_keeps_schema_values_and_metadata(tmp_path):
    _write(tmp_path)
    features = read_table(tmp_path, "sae-a", FEATURES_FILE)
    assert dict(features.schema) == FEATURES_SCHEMA
    assert features.equals(_features())
    examples = read_table(tmp_path, "sae-a", EXAMPLES_FILE)
    assert dict(examples.schema) == EXAMPLES_SCHEMA
    expected = _examples().sort(["latent", "band", "rank"], nulls_last=False, maintain_order=True)
    assert examples.equals(expected)
    meta = pl.read_parquet_metadata(tmp_path / "saes" / "sae-a" / FEATURES_FILE)
    assert meta["schema_version"] == "1" and meta["sae_atlas_table"] == "features"
    sidecar = json.loads((tmp_path / "saes" / "sae-a" / TABLES_FILE).read_text())
    assert sidecar["schema_version"] == 1 and sidecar["params"]["top_k"] == 2
    assert set(sidecar["files"]) == {FEATURES_FILE, EXAMPLES_FILE, "occurrence.npz"}


def test_lookups_by_latent_and_token(tmp_path):
    _write(tmp_path)
    tables = FeatureTables(tmp_path, "sae-a")
    assert tables.n_latents == F and tables.params["n_tokens"] == 100
    assert tables.feature(2)["max_act"] == 4.0 and tables.feature(4)["quantiles"] is None
    three = tables.examples_for(3)
    assert three["latent"].to_list() == [3] * 4 and three["rank"].to_list() == [0, 1, 2, 3]
    zero = tables.examples_for(0)
    assert zero["kind"].to_list() == ["top", "top", "band"]
    assert tables.examples_for(0, "band")["kind"].to_list() == ["band"]
    assert tables.examples_for(0, "top")["rank"].to_list() == [0, 1]
    assert tables.examples_for(3, "band").height == 0
    assert tables.examples_for(2).height == 0 and tables.examples_for(4).height == 0
    with pytest.raises(InvalidInputError, match="valid 0..4"):
        tables.examples_for(5)
    with pytest.raises(InvalidInputError, match="top, band"):
        tables.examples_for(0, "bottom")
    centred = tables.latents_centred_on(11)
    assert centred["latent"].to_list() == [3, 0]  # 4 examples, then 2
    assert centred["n_examples"].to_list() == [4, 2]
    assert tables.latents_centred_on(12)["latent"].to_list() == [1]
    assert tables.latents_centred_on(12, kind="band")["latent"].to_list() == [0]
    promoting = tables.latents_promoting(7)
    assert promoting["latent"].to_list() == [4, 3, 2, 1, 0]  # logit 0.5 + i
    assert tables.latents_promoting(2)["latent"].to_list() == [2]
    assert tables.latents_promoting(99).height == 0
    with pytest.raises(InvalidInputError):
        tables.latents_promoting(-1)


def _assert_integrity(tmp_path, name: str, match: str) -> None:
    with pytest.raises(IntegrityError, match=match) as info:
        FeatureTables(tmp_path, "sae-a")
    assert info.value.path.endswith(name)
    assert f"sae-atlas summarize {tmp_path} --sae sae-a" in str(info.value)


def test_truncated_table_is_an_integrity_error(tmp_path):
    _write(tmp_path)
    path = tmp_path / "saes" / "sae-a" / FEATURES_FILE
    path.write_bytes(path.read_bytes()[:100])
    _assert_integrity(tmp_path, FEATURES_FILE, "sha256")


def test_flipped_byte_and_missing_file(tmp_path):
    _write(tmp_path)
    path = tmp_path / "saes" / "sae-a" / EXAMPLES_FILE
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    _assert_integrity(tmp_path, EXAMPLES_FILE, "sha256")
    path.unlink()
    _assert_integrity(tmp_path, EXAMPLES_FILE, "missing")


def _replace_file(tmp_path, name: str, frame: pl.DataFrame) -> None:
    """Overwrite a table and fix its checksum, so only the content check can catch it."""
    folder = tmp_path / "saes" / "sae-a"
    frame.write_parquet(folder / name)
    sidecar = json.loads((folder / TABLES_FILE).read_text())
    sidecar["files"][name]["sha256"] = sha256_file(folder / name)
    atomic_write_json(folder / TABLES_FILE, sidecar)


def test_wrong_schema_and_garbage_with_valid_checksum(tmp_path):
    _write(tmp_path)
    _replace_file(tmp_path, FEATURES_FILE, _features().drop("density"))
    _assert_integrity(tmp_path, FEATURES_FILE, "schema")
    _replace_file(tmp_path, FEATURES_FILE, _features().with_columns(pl.col("latent").cast(pl.Int64)))
    _assert_integrity(tmp_path, FEATURES_FILE, "schema")
    _replace_file(tmp_path, FEATURES_FILE, _features().head(3))
    _assert_integrity(tmp_path, FEATURES_FILE, "row count")
    folder = tmp_path / "saes" / "sae-a"
    (folder / FEATURES_FILE).write_bytes(b"not parquet at all")
    sidecar = json.loads((folder / TABLES_FILE).read_text())
    sidecar["files"][FEATURES_FILE]["sha256"] = sha256_file(folder / FEATURES_FILE)
    atomic_write_json(folder / TABLES_FILE, sidecar)
    _assert_integrity(tmp_path, FEATURES_FILE, "parquet")


def test_examples_out_of_schema_order_are_an_integrity_error(tmp_path):
    _write(tmp_path)
    examples = read_table(tmp_path, "sae-a", EXAMPLES_FILE)
    _replace_file(tmp_path, EXAMPLES_FILE, examples.sort("kind"))  # band row before latent 0's tops
    _assert_integrity(tmp_path, EXAMPLES_FILE, "not sorted")
    _replace_file(tmp_path, EXAMPLES_FILE, examples.with_columns(pl.col("latent") + 5))
    _assert_integrity(tmp_path, EXAMPLES_FILE, "within 0..d_sae-1")


def test_sidecar_problems(tmp_path):
    _write(tmp_path)
    sidecar_path = tmp_path / "saes" / "sae-a" / TABLES_FILE
    good = sidecar_path.read_text()
    sidecar_path.write_text(good[:40])
    _assert_integrity(tmp_path, TABLES_FILE, "JSON")
    sidecar_path.write_text(good.replace('"schema_version": 1', '"schema_version": 99'))
    _assert_integrity(tmp_path, TABLES_FILE, "version 99")
    sidecar_path.unlink()
    _assert_integrity(tmp_path, TABLES_FILE, "file is missing while features.parquet")
    with pytest.raises(NotFoundError, match="sae-a"):
        FeatureTables(tmp_path, "nope")


def test_occurrence_matrix_streams_and_round_trips(tmp_path):
    folder = write_sae(tmp_path, "s", np.eye(40, dtype=np.float32), HOOK)
    rng = np.random.default_rng(0)
    dense = rng.integers(0, 4, size=(23, 40)) * (rng.random((23, 40)) < 0.2)
    dense[5] = 0  # a block where nothing fired
    writer = OccurrenceWriter(tmp_path, "s", 40)
    for start in range(0, 23, 6):
        writer.append(np.arange(100 + start, 100 + min(start + 6, 23)), dense[start : start + 6])
    writer.finish()
    assert not [p for p in folder.iterdir() if p.name.startswith(".occurrence")]  # spool removed
    write_tables(tmp_path, "s", _features().head(0), _examples().head(0), {})
    matrix, blocks = load_occurrence(tmp_path, "s")
    assert matrix.shape == (23, 40) and np.array_equal(matrix.toarray(), dense)
    assert np.array_equal(blocks, np.arange(100, 123))
    co = (matrix > 0).astype(np.int64)
    assert np.array_equal((co.T @ co).toarray(), (dense > 0).T.astype(int) @ (dense > 0).astype(int))
    (folder / "occurrence.npz").write_bytes(b"x")
    with pytest.raises(IntegrityError, match="occurrence.npz"):
        load_occurrence(tmp_path, "s")


def test_writer_rejects_bad_frames(tmp_path):
    with pytest.raises(InvalidInputError, match="density"):
        conform(_features().drop("density"), FEATURES_SCHEMA, FEATURES_FILE)
    wrong_type = _features().with_columns(pl.lit("many").alias("n_active"))
    with pytest.raises(InvalidInputError, match=r"columns \['n_active'\] cannot be cast"):
        conform(wrong_type, FEATURES_SCHEMA, FEATURES_FILE)
    folder = AtlasLayout(tmp_path).sae_dir("s")
    folder.mkdir(parents=True)
    with pytest.raises(InvalidInputError, match="occurrence"):
        write_tables(tmp_path, "s", _features(), _examples(), {})
    with pytest.raises(InvalidInputError, match="in order"):
        write_tables(tmp_path, "s", _features().reverse(), _examples(), {})


def test_histogram_edges_and_ragged_lists():
    edges = histogram_edges(8.0, n_bins=6, bins_per_octave=2)
    assert np.allclose(edges, [1.0, 2**0.5, 2.0, 2**1.5, 4.0, 2**2.5, 8.0])
    flat = np.arange(9)
    series = padded_list("x", flat, 3, pl.Int32(), start=np.array([0, 1, 2]), length=np.array([3, 0, 1]))
    assert series.to_list() == [[0, 1, 2], [], [8]] and series.dtype == pl.List(pl.Int32)
    assert padded_list("y", flat, 3, pl.Int64()).to_list() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
