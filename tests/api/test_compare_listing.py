"""The listing of stored comparisons (`Atlas.comparisons()`, `GET /compare`) reports every
run on disk with its status, as the analyses listing does: a run that `runs.json` no longer
lists is "unregistered" and a run with a damaged file "damaged", never silently left out."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from starlette.testclient import TestClient

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.layout import AtlasLayout


def _store_run(root: Path, run: str, mcc: float) -> None:
    write_analysis(root, "compare", run, parameters={"sae_a": "a", "atlas_b": str(root), "sae_b": run[-1]},
                   summary={"n_tokens": 64, "mcc": mcc, "mcc_null": {"null_mean": 0.1}, "decoder_mcc": None},
                   tables={"main": pl.DataFrame({"a_latent": [0], "b_latent": [0], "corr": [mcc]}),
                           "null": pl.DataFrame({"corr": [0.1]})})


@pytest.fixture
def atlas(tmp_path: Path) -> Path:
    """An atlas with two stored comparisons, `a--b` and `a--c`."""
    root = tmp_path / "atlas"
    AtlasLayout(root).update_meta(model={"kind": "tiny"})
    _store_run(root, "a--b", 0.9)
    _store_run(root, "a--c", 0.4)
    return root


def _listing(root: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    python = {row["run"]: dict(row) for row in Atlas(root).comparisons()}
    with TestClient(create_app(ServerSettings(root=root))) as http:
        answer = http.get("/compare")
    assert answer.status_code == 200, answer.text
    return python, {row["run"]: row for row in answer.json()}


def test_every_stored_comparison_is_listed_ok(atlas: Path):
    python, http = _listing(atlas)
    assert python == http and sorted(python) == ["a--b", "a--c"]
    assert python["a--b"]["mcc"] == pytest.approx(0.9) and python["a--b"]["status"] == "ok"
    assert python["a--b"]["problem"] is None


def test_a_run_removed_from_runs_json_is_reported_unregistered(atlas: Path):
    runs = atlas / "analyses" / "compare" / "runs.json"
    index = json.loads(runs.read_text())
    del index["runs"]["a--c"]  # a valid-JSON edit that drops one run's entry
    runs.write_text(json.dumps(index))
    python, http = _listing(atlas)
    assert python == http and sorted(python) == ["a--b", "a--c"]
    assert python["a--b"]["status"] == "ok"
    row = python["a--c"]
    assert row["status"] == "unregistered" and row["mcc"] == pytest.approx(0.4)  # its files verify
    assert row["problem"].startswith("analyses/compare/a--c.json: the run is on disk but not recorded in runs.json")
    assert "sae-atlas register <atlas> --analysis compare/a--c" in row["problem"]
    statuses = Atlas(atlas).analyses().frame.filter(pl.col("kind") == "compare").select("run", "status").rows()
    assert statuses == [("a--b", "ok"), ("a--c", "unregistered")]  # the same as the analyses listing


def test_a_damaged_run_is_listed_damaged_naming_the_file(atlas: Path):
    (atlas / "analyses" / "compare" / "a--b.null.parquet").write_bytes(b"broken")
    python, http = _listing(atlas)
    assert python == http and python["a--c"]["status"] == "ok"
    row = python["a--b"]
    assert row["status"] == "damaged" and row["mcc"] is None
    assert row["problem"].startswith("analyses/compare/a--b.null.parquet: ") and str(atlas) not in row["problem"]
    assert "(`sae-atlas compare A B --run a--b`)" in row["problem"]  # the verb that writes comparisons


def test_compare_decoder_with_different_d_model_is_refused_before_loading(tmp_path: Path, monkeypatch):
    """`compare A B --decoder` over SAEs of different widths is refused from their stored
    configs: no model and no SAE is loaded first."""
    from typer.testing import CliRunner

    import sae_atlas.api.context as context
    import sae_atlas.api.sae_view as sae_view
    from sae_atlas.api.cli import app
    from sae_atlas.saes.formats.saelens import save_saelens
    from sae_atlas.saes.sae.architectures import build_sae
    from sae_atlas.saes.sae.base import SAEConfig

    sides = []
    for name, width in (("a", 32), ("b", 16)):
        root = tmp_path / name
        AtlasLayout(root).update_meta(model={"kind": "tiny", "n_layers": 1, "d_model": width})
        save_saelens(build_sae(SAEConfig("topk", d_in=width, d_sae=8, k=2, hook_name="blocks.0.hook_resid_post")),
                     AtlasLayout(root).sae_dir("s"))
        sides.append(f"{root}:s")

    def loaded(*args, **kwargs):
        raise AssertionError("loaded before the widths were checked")

    monkeypatch.setattr(context, "load_model", loaded)  # every model and SAE of an operation loads through these
    monkeypatch.setattr(sae_view, "load_atlas_sae", loaded)
    refused = CliRunner().invoke(app, ["compare", *sides, "--decoder", "--tokens", "64"])
    assert refused.exit_code == 2, refused.output
    assert "decoder matching needs a shared d_model: A's decoder rows have d=32, B's d=16" in refused.output
    assert not (tmp_path / "a" / "analyses").exists()
    without = CliRunner().invoke(app, ["compare", *sides, "--tokens", "64"])  # no --decoder: no early refusal
    assert "loaded before the widths were checked" in repr(without.exception)
