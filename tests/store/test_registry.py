"""The registries of an atlas compared with what is on disk: SAE folders atlas.json does not
list and analysis runs their kind's runs.json does not list are found, described with the
command that registers them again, and registered again only when their files verify."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.atlas_records import SOURCE_FILE, TRAINING_FILE, register_sae
from sae_atlas.saes.formats.saelens import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.analysis_runs import (
    RUNS_FILE,
    analysis_kinds,
    figure_owner,
    list_runs,
    register_run,
    unregistered_runs,
    verify_run,
    write_analysis,
)
from sae_atlas.store.layout import MAX_ID_LENGTH, AtlasLayout, check_id

HOOK = "blocks.0.hook_resid_post"


@pytest.mark.parametrize("value,ok", [
    ("blocks.0.hook_resid_post-topk-64", True), ("a", True), ("a.", True), ("a" * MAX_ID_LENGTH, True),
    ("a" * (MAX_ID_LENGTH + 1), False), ("a..b", False), (".a", False), ("a/b", False), ("abc\n", False), ("", False),
])
def test_check_id_is_the_published_pattern(value: str, ok: bool) -> None:
    if ok:
        assert check_id(value) == value
    else:
        with pytest.raises(InvalidInputError):
            check_id(value)


def _sae_folder(root: Path, sae_id: str) -> Path:
    """A tiny TopK SAE saved as an atlas SAE folder (cfg.json with its checksums, weights)."""
    folder = AtlasLayout(root).sae_dir(sae_id)
    folder.mkdir(parents=True)
    save_saelens(build_sae(SAEConfig("topk", d_in=8, d_sae=16, k=2, hook_name=HOOK)), folder)
    return folder


def _training(folder: Path, status: str = "complete") -> dict:
    record = {"status": status, "sae_config": {}, "train_config": {"total_tokens": 4096}, "input_scale": 2.0,
              "final_metrics": {"fvu": 0.3, "l0": 2.0}, "heldout_metrics": {"fvu": 0.4, "l0": 2.0, "dead_fraction": 0.1}}
    (folder / TRAINING_FILE).write_text(json.dumps(record))
    return record


def test_unregistered_sae_folders_are_found_and_registered_again(tmp_path: Path) -> None:
    layout = AtlasLayout(tmp_path)
    trained = _sae_folder(tmp_path, "trained")
    assert layout.unregistered_sae_ids() == []  # no atlas.json yet: nothing is registered or not
    layout.write_meta({"saes": {}})
    _training(trained)
    imported = _sae_folder(tmp_path, "imported")
    (imported / SOURCE_FILE).write_text(json.dumps({"kind": "folder", "source": "/models/x", "format": "saelens",
                                                    "suspect": True, "hook": HOOK}))
    (imported / "eval.json").write_text(json.dumps({"metrics": {"fvu": 0.2, "l0": 3.0, "dead_fraction": 0.0}}))
    assert layout.unregistered_sae_ids() == ["imported", "trained"]
    problem = layout.unregistered_sae("trained")
    assert problem.path == str(layout.atlas_json) and "--sae trained" in problem.repair

    assert register_sae(tmp_path, "trained") == {
        "sae_id": "trained", "hook": HOOK, "architecture": "topk", "d_in": 8, "d_sae": 16, "k": 2, "tokens": 4096,
        "input_scale": 2.0, "train_fvu": 0.3, "train_l0": 2.0, "fvu": 0.4, "l0": 2.0, "dead_fraction": 0.1}
    assert register_sae(tmp_path, "imported") == {
        "sae_id": "imported", "hook": HOOK, "architecture": "topk", "d_in": 8, "d_sae": 16, "k": 2, "fvu": 0.2,
        "l0": 3.0, "dead_fraction": 0.0, "source": {"kind": "folder", "source": "/models/x", "format": "saelens"},
        "suspect": True}
    assert layout.unregistered_sae_ids() == [] and layout.registered_sae_ids() == ["imported", "trained"]
    with pytest.raises(InvalidInputError, match="already registered"):
        register_sae(tmp_path, "trained")
    with pytest.raises(NotFoundError, match="no SAE folder"):
        register_sae(tmp_path, "never-saved")


@pytest.mark.parametrize("damage,named", [
    ("unfinished", "did not finish"), ("no-record", "neither a finished training nor an import"),
    ("weights", "sae_weights.safetensors"), ("foreign-cfg", "no valid sae_atlas.sae_config"),
])
def test_a_folder_that_cannot_be_registered_is_named_and_atlas_json_kept(tmp_path: Path, damage: str,
                                                                         named: str) -> None:
    layout = AtlasLayout(tmp_path)
    layout.write_meta({"saes": {}})
    folder = _sae_folder(tmp_path, "s")
    _training(folder, "running" if damage == "unfinished" else "complete")
    if damage == "no-record":
        (folder / TRAINING_FILE).unlink()
    if damage == "foreign-cfg":  # a SAELens cfg.json without the section sae-atlas writes
        cfg = json.loads((folder / "cfg.json").read_text())
        del cfg["sae_atlas"]
        (folder / "cfg.json").write_text(json.dumps(cfg))
    if damage == "weights":
        weights = folder / "sae_weights.safetensors"
        weights.write_bytes(weights.read_bytes()[:-4])
    before = layout.atlas_json.read_bytes()
    with pytest.raises(IntegrityError, match=named):
        register_sae(tmp_path, "s")
    assert layout.atlas_json.read_bytes() == before


def _run(root: Path, kind: str, run: str) -> Path:
    folder = AtlasLayout(root).analysis_dir(kind)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{run}.png").write_bytes(b"\x89PNG " + run.encode())
    return write_analysis(root, kind, run, parameters={"seed": 0}, tables={"main": pl.DataFrame({"x": [1, 2]})},
                          extra={"figures": [f"{run}.png"]})


def _unrecord(root: Path, kind: str, run: str) -> None:
    path = AtlasLayout(root).analysis_dir(kind) / RUNS_FILE
    runs = json.loads(path.read_text())
    del runs["runs"][run]
    path.write_text(json.dumps(runs))


def test_an_unregistered_run_is_named_not_served_and_registered_again(tmp_path: Path) -> None:
    _run(tmp_path, "circular", "a")
    _run(tmp_path, "circular", "b")
    _unrecord(tmp_path, "circular", "b")
    (tmp_path / "analyses" / ".ipynb_checkpoints").mkdir()  # no kind can have that name
    assert analysis_kinds(tmp_path) == ["circular"]
    assert list_runs(tmp_path, "circular") == ["a"] and unregistered_runs(tmp_path, "circular") == ["b"]
    for read in (lambda: verify_run(tmp_path, "circular", "b"), lambda: figure_owner(tmp_path, "circular", "b.png")):
        with pytest.raises(IntegrityError, match="not recorded in runs.json") as raised:
            read()
        assert "sae-atlas register <atlas> --analysis circular/b" in raised.value.repair
    assert figure_owner(tmp_path, "circular", "a.png")[0] == "a"
    assert register_run(tmp_path, "circular", "b")["run"] == "b"
    assert list_runs(tmp_path, "circular") == ["a", "b"] and unregistered_runs(tmp_path, "circular") == []
    assert figure_owner(tmp_path, "circular", "b.png")[0] == "b"
    with pytest.raises(InvalidInputError, match="already registered"):
        register_run(tmp_path, "circular", "b")
    with pytest.raises(NotFoundError, match="no circular analysis run 'c' on disk"):
        register_run(tmp_path, "circular", "c")


@pytest.mark.parametrize("name", ["b.parquet", "b.png"])
def test_an_unregistered_run_whose_file_changed_is_not_registered(tmp_path: Path, name: str) -> None:
    _run(tmp_path, "circular", "b")
    _unrecord(tmp_path, "circular", "b")
    runs_json = AtlasLayout(tmp_path).analysis_dir("circular") / RUNS_FILE
    before = runs_json.read_bytes()
    changed = runs_json.parent / name
    changed.write_bytes(changed.read_bytes() + b"x")
    for act in (lambda: register_run(tmp_path, "circular", "b"), lambda: verify_run(tmp_path, "circular", "b")):
        with pytest.raises(IntegrityError, match="sha256 does not match") as raised:  # the damage, named first
            act()
        assert raised.value.path == str(changed)
    assert runs_json.read_bytes() == before
