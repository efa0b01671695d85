"""Damaged analysis files are named, never served: a flipped byte, a truncation or a deletion
of a run's JSON, table, figure or the kind's runs.json gives an IntegrityError that names
the file and the repair, from Python (`Atlas`) and over HTTP; the listing marks the run
damaged instead of dropping it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from starlette.testclient import TestClient

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services import analyses
from sae_atlas.errors import IntegrityError, NotFoundError
from sae_atlas.store.analysis_runs import RUNS_FILE, list_runs, read_analysis, write_analysis
from tests.api.small_atlas import PLANTED_KIND, PLANTED_RUN

KIND, RUN = PLANTED_KIND, PLANTED_RUN


@pytest.fixture()
def root(small_atlas: dict[str, Any], tmp_path: Path) -> Path:
    """A private copy of the small atlas (its planted run written by `write_analysis`)."""
    return Path(shutil.copytree(small_atlas["root"], tmp_path / "atlas"))


def _flip(path: Path) -> None:
    """Change one byte so that the file stays well-formed where it can: inside a JSON string
    value ("seed" -> "seeD"), else in the middle of the file."""
    data = bytearray(path.read_bytes())
    at = data.find(b'"seed"') + 4 if path.suffix == ".json" and b'"seed"' in data else len(data) // 2
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE: dict[str, Callable[[Path], None]] = {"flip": _flip, "truncate": _truncate, "delete": Path.unlink}
FILES = {"json": f"{RUN}.json", "parquet": f"{RUN}.parquet", "png": f"{RUN}.png", "runs": RUNS_FILE}


def _named(text: str, name: str) -> bool:
    return name in text and ("repair" in text.lower() or "re-run" in text)


@pytest.mark.parametrize("how", sorted(DAMAGE))
@pytest.mark.parametrize("which", sorted(FILES))
def test_damaged_run_is_refused_and_listed_as_damaged(root: Path, which: str, how: str) -> None:
    folder = root / "analyses" / KIND
    name = FILES[which]
    DAMAGE[how](folder / name)
    atlas = Atlas(root)
    with pytest.raises(IntegrityError) as raised:
        atlas.analysis(KIND, RUN)
    assert _named(str(raised.value), name), str(raised.value)
    with pytest.raises(IntegrityError, match=name.replace(".", r"\.")):
        atlas.figure_path(KIND, f"{RUN}.png")
    rows = [r for r in atlas.analyses().to_dicts() if r["kind"] == KIND]
    assert [r["run"] for r in rows] == [RUN], rows  # still listed, not dropped
    assert rows[0]["status"] == "damaged" and _named(rows[0]["problem"], name), rows

    from sae_atlas.api.http import ServerSettings, create_app

    with TestClient(create_app(ServerSettings(root=root))) as client:
        for url in (f"/analyses/{KIND}/{RUN}", f"/analyses/{KIND}/figures/{RUN}.png"):
            answer = client.get(url)
            assert answer.status_code == 500, (url, answer.text)
            body = answer.json()
            assert body["error"] == "integrity" and body["path"] == f"analyses/{KIND}/{name}", body
            assert str(root) not in answer.text and body["repair"]
        listing = client.get("/analyses").json()
        assert [r["status"] for r in listing if r["kind"] == KIND] == ["damaged"]
        assert str(root) not in json.dumps(listing)


def test_intact_run_round_trips_with_every_checksum(root: Path) -> None:
    stored = read_analysis(root, KIND, RUN)
    assert stored.table is not None and stored.table.height == 2
    assert set(stored.meta["figure_sha256"]) == {f"{RUN}.png"} and stored.meta["format"] == 2
    runs = json.loads((root / "analyses" / KIND / RUNS_FILE).read_text())["runs"]
    assert set(runs) == {RUN} and len(runs[RUN]["sha256"]) == 64


def test_a_run_killed_before_its_registration_is_reported(root: Path) -> None:
    """The JSON is written before runs.json: a run whose JSON exists but is not registered
    did not finish, and says so."""
    folder = root / "analyses" / KIND
    (folder / "half.json").write_text(json.dumps({"kind": KIND, "run": "half", "tables": {}, "format": 2}))
    atlas = Atlas(root)
    with pytest.raises(IntegrityError, match="not recorded in runs.json"):
        atlas.analysis(KIND, "half")
    rows = {r["run"]: r for r in atlas.analyses().to_dicts() if r["kind"] == KIND}
    assert rows[RUN]["status"] == "ok" and rows["half"]["status"] == "unregistered"
    assert "sae-atlas register" in rows["half"]["problem"]
    with pytest.raises(NotFoundError, match=RUN):
        atlas.analysis(KIND, "never-written")


def test_a_figure_must_exist_before_its_run_is_written(root: Path) -> None:
    with pytest.raises(Exception, match="was not written"):
        write_analysis(root, KIND, "nofig", parameters={}, extra={"figures": ["nofig.png"]})
    assert "nofig" not in list_runs(root, KIND)


def test_runs_from_before_runs_json_are_served_and_adopted(tmp_path: Path) -> None:
    """A folder written before checksummed runs (JSON without `format`, no runs.json) is read
    as it was; the next run written there registers the old ones too."""
    folder = tmp_path / "analyses" / "legacy"
    folder.mkdir(parents=True)
    pl.DataFrame({"x": [1, 2]}).write_parquet(folder / "old.parquet")
    (folder / "old.json").write_text(json.dumps({"params": {"seed": 0}}))
    (folder / "old.png").write_bytes(b"\x89PNG old")
    assert list_runs(tmp_path, "legacy") == ["old"]
    assert analyses.figure_path(tmp_path, "legacy", "old.png").read_bytes() == b"\x89PNG old"
    assert analyses.analysis_runs(tmp_path)[0]["figures"] == ["old.png"]
    write_analysis(tmp_path, "legacy", "new", parameters={}, tables={"main": pl.DataFrame({"y": [3]})})
    assert list_runs(tmp_path, "legacy") == ["new", "old"]
    (folder / "old.json").write_text(json.dumps({"params": {"seed": 1}}))  # changed after adoption
    with pytest.raises(IntegrityError, match="old.json"):
        read_analysis(tmp_path, "legacy", "old")
    assert read_analysis(tmp_path, "legacy", "new").table["y"].to_list() == [3]
