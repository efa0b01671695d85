"""SAEs and analysis runs on disk that atlas.json or their kind's runs.json does not list are
reported as "unregistered", with the command that registers them again, from Python
(`Atlas.saes()`, `Atlas.analyses()`), over HTTP (`/saes`, `/analyses`, `/health`) and the
CLI; `sae-atlas register` makes them registered again. Neither is silently dropped, and an
unregistered run is never served as if registered."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.errors import IntegrityError
from sae_atlas.store.analysis_runs import RUNS_FILE
from tests.api.conftest import LiveServer
from tests.api.small_atlas import PLANTED_KIND, PLANTED_RUN

KIND, RUN = "circular", "weekday-run"


def _circular_run(root: Path) -> None:
    """A circular run with a table and a figure (the planted run's, under another kind)."""
    from sae_atlas.store.analysis_runs import read_analysis, write_analysis

    planted = read_analysis(root, PLANTED_KIND, PLANTED_RUN)
    folder = root / "analyses" / KIND
    folder.mkdir(parents=True)
    shutil.copy(root / "analyses" / PLANTED_KIND / f"{PLANTED_RUN}.png", folder / f"{RUN}.png")
    write_analysis(root, KIND, RUN, parameters={"seed": 0}, tables={"main": planted.table},
                   extra={"figures": [f"{RUN}.png"]})


@pytest.fixture()
def audited(small_atlas: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """A copy of the small atlas with a circular run, then the audit's two edits: the run
    taken out of analyses/circular/runs.json and the first SAE out of atlas.json (their
    files left as they are)."""
    root = Path(shutil.copytree(small_atlas["root"], tmp_path / "atlas"))
    _circular_run(root)
    runs_json = root / "analyses" / KIND / RUNS_FILE
    runs = json.loads(runs_json.read_text())
    del runs["runs"][RUN]
    runs_json.write_text(json.dumps(runs))
    sae = small_atlas["sae_ids"][0]
    meta = json.loads((root / "atlas.json").read_text())
    record = meta["saes"].pop(sae)
    (root / "atlas.json").write_text(json.dumps(meta))
    return {"root": root, "sae": sae, "record": record}


@pytest.fixture()
def live(audited: dict[str, Any]) -> Iterator[LiveServer]:
    with LiveServer(audited["root"]) as server:
        yield server


def _register(*args: str) -> Any:
    return CliRunner().invoke(app, ["register", *args, "--json"])


def test_unregistered_sae_and_run_are_reported_from_python(audited: dict[str, Any], small_atlas: dict[str, Any]) -> None:
    root, sae = audited["root"], audited["sae"]
    atlas = Atlas(root)
    rows = {r["sae_id"]: r for r in atlas.saes().to_dicts()}
    assert set(rows) == set(small_atlas["sae_ids"])  # listed, not dropped
    assert rows[sae]["status"] == "unregistered" and rows[small_atlas["sae_ids"][1]]["status"] == "ok"
    assert f"sae-atlas register <atlas> --sae {sae}" in rows[sae]["problem"]
    assert rows[sae]["problem"].startswith("atlas.json: ") and str(root) not in rows[sae]["problem"]
    record = audited["record"]
    assert {k: rows[sae][k] for k in ("hook", "d_sae", "k", "fvu", "l0", "dead_fraction")} == {
        k: record[k] for k in ("hook", "d_sae", "k", "fvu", "l0", "dead_fraction")}  # what register would write
    runs = {(r["kind"], r["run"]): r for r in atlas.analyses().to_dicts()}
    run = runs[(KIND, RUN)]
    assert run["status"] == "unregistered" and run["figures"] == [f"{RUN}.png"]
    assert f"sae-atlas register <atlas> --analysis {KIND}/{RUN}" in run["problem"]
    for read in (lambda: atlas.analysis(KIND, RUN), lambda: atlas.figure_path(KIND, f"{RUN}.png")):
        with pytest.raises(IntegrityError, match="not recorded in runs.json") as raised:  # not served, not a 404
            read()
        assert "sae-atlas register" in raised.value.repair
    assert runs[(PLANTED_KIND, PLANTED_RUN)]["status"] == "ok"


def test_unregistered_sae_and_run_are_reported_over_http(live: LiveServer, audited: dict[str, Any]) -> None:
    sae = audited["sae"]
    with httpx.Client(base_url=live.url, timeout=60) as http:
        saes = {s["sae_id"]: s for s in http.get("/saes").json()}
        assert saes[sae]["status"] == "unregistered" and "sae-atlas register" in saes[sae]["problem"]
        runs = {(r["kind"], r["run"]): r for r in http.get("/analyses").json()}
        assert runs[(KIND, RUN)]["status"] == "unregistered"
        health = http.get("/health").json()
        assert set(health["unregistered_saes"]) == {sae} and "--sae " + sae in health["unregistered_saes"][sae]
        assert set(health["unregistered_analyses"]) == {f"{KIND}/{RUN}"}
        assert str(audited["root"]) not in json.dumps(health)
        for path in (f"/analyses/{KIND}/{RUN}", f"/analyses/{KIND}/figures/{RUN}.png"):
            answer = http.get(path)
            assert answer.status_code == 500, (path, answer.text)
            body = answer.json()
            assert body["error"] == "integrity" and body["path"] == f"analyses/{KIND}/{RUN}.json", body
            assert f"sae-atlas register <atlas> --analysis {KIND}/{RUN}" in body["repair"]
        assert http.get(f"/saes/{sae}/features/3").json()["index"] == 3  # served from its folder, marked above

        result = _register(str(audited["root"]))  # everything unregistered
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == [
            {"what": "sae", "name": sae, "result": "registered"},
            {"what": "analysis", "name": f"{KIND}/{RUN}", "result": "registered"}]
        assert {s["status"] for s in http.get("/saes").json()} == {"ok"}
        assert {r["status"] for r in http.get("/analyses").json()} == {"ok"}
        assert http.get(f"/analyses/{KIND}/figures/{RUN}.png").content.startswith(b"\x89PNG")
        assert http.get(f"/analyses/{KIND}/{RUN}").json()["n_rows"] == 2
        health = http.get("/health").json()
        assert "unregistered_saes" not in health and "unregistered_analyses" not in health
    meta = json.loads((audited["root"] / "atlas.json").read_text())
    assert meta["saes"][sae] == audited["record"]  # rebuilt exactly as training wrote it


def test_register_by_name_and_what_it_refuses(audited: dict[str, Any], small_atlas: dict[str, Any]) -> None:
    root, sae = audited["root"], audited["sae"]
    result = _register(str(root), "--analysis", f"{KIND}/{RUN}")
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in Atlas(root).analyses().to_dicts() if r["kind"] == KIND] == ["ok"]
    assert Atlas(root).sae_status(sae)["status"] == "unregistered"  # only what was named
    again = _register(str(root), "--analysis", f"{KIND}/{RUN}", "--sae", small_atlas["sae_ids"][1])
    assert again.exit_code == 2
    assert [r["result"].split(":")[0] for r in json.loads(again.stdout)] == ["refused", "refused"]
    assert "already registered" in again.stdout
    assert _register(str(root), "--analysis", "no-slash").exit_code == 2
    (root / "saes" / sae / "training.json").unlink()  # nothing left to rebuild its record from
    row = Atlas(root).sae_status(sae)
    assert row["status"] == "unregistered" and "training.json: file is missing" in row["problem"]
    assert str(root) not in row["problem"]
    refused = _register(str(root), "--sae", sae)
    assert refused.exit_code == 2 and "training.json" in refused.stdout
    assert sae not in json.loads((root / "atlas.json").read_text())["saes"]


def test_an_unregistered_run_with_a_damaged_file_is_damaged(audited: dict[str, Any]) -> None:
    """Its files are checked against its JSON first: a changed table is named, and the run
    cannot be registered."""
    root = audited["root"]
    table = root / "analyses" / KIND / f"{RUN}.parquet"
    table.write_bytes(table.read_bytes()[:-8])
    row = next(r for r in Atlas(root).analyses().to_dicts() if r["run"] == RUN)
    assert row["status"] == "damaged" and row["problem"].startswith(f"analyses/{KIND}/{RUN}.parquet")
    result = _register(str(root), "--analysis", f"{KIND}/{RUN}")
    assert result.exit_code == 2 and f"{RUN}.parquet" in result.stdout
    runs = json.loads((root / "analyses" / KIND / RUNS_FILE).read_text())["runs"]
    assert RUN not in runs
