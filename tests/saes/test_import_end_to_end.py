"""End to end: SAEs imported into a small atlas (one good, one kept with --force, of two
widths at the same hook, next to the trained one) are summarized, indexed (the model-wide
index and the cross-layer flow cover all three), served, and their feature pages open in
Chromium with the suspect mark where it belongs; `sae-atlas import` from the command line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from sae_atlas.store.layout import AtlasLayout
from tests.fixtures.import_atlas import (
    D_SAE,
    build_import_atlas,
    weights,
    write_dictionary_learning,
    write_gemma_scope,
)

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
GOOD, SUSPECT = "gemma-imported", "narrow-suspect"
NARROW = 48


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from sae_atlas import Atlas
    from sae_atlas.saes.summary.run import summarize_sae
    from sae_atlas.store.index import build_atlas_indexes

    tmp = tmp_path_factory.mktemp("e2e")
    built = build_import_atlas(tmp / "atlas")
    root, handle, w = built["root"], built["handle"], weights(built["sae"])
    atlas = Atlas(root, model=handle)
    gemma = write_gemma_scope(tmp / "gemma-scope-tiny-res" / "layer_1" / f"width_{D_SAE}" / "average_l0_4", w)
    atlas.add_sae(gemma, sae_id=GOOD)
    narrow = {k: v[:NARROW] if k in ("b_enc", "threshold") else v for k, v in w.items()}
    narrow = {**narrow, "W_enc": w["W_enc"][:, :NARROW], "W_dec": w["W_dec"][:NARROW]}
    stripped = write_dictionary_learning(tmp / "dl", narrow, threshold=-1.0)
    atlas.add_sae(stripped, sae_id=SUSPECT, force=True, with_model=False)
    for sae_id in (built["sae_id"], GOOD, SUSPECT):
        summarize_sae(root, sae_id, W_U=handle.W_U.detach(), final_norm_weight=handle.final_norm_weight,
                      norm_kind=handle.final_norm_kind, tokenizer=handle.tokenizer, top_k=8,
                      window=(6, 2), progress=False)
    build_atlas_indexes(root)
    return {**built, "atlas": Atlas(root, model=handle), "w": w}


def test_imported_saes_join_the_model_wide_index_and_flow(imported: dict[str, Any]) -> None:
    from sae_atlas.store.index import model_members

    members, excluded = model_members(imported["root"])
    assert {GOOD, SUSPECT, imported["sae_id"]} <= set(members) and excluded == []
    atlas = imported["atlas"]
    matches = atlas.flow(GOOD, 3, k=1).to_dicts()
    assert {m["sae_id"] for m in matches} == {imported["sae_id"], SUSPECT}  # both widths
    trained = next(m for m in matches if m["sae_id"] == imported["sae_id"])
    assert trained["latent"] == 3 and trained["cosine"] == pytest.approx(1.0, abs=1e-4)  # the same dictionary
    across = atlas.similar(SUSPECT, 5, k=3).to_dicts()
    assert all(m["sae_id"] == SUSPECT for m in across)


def _chromium() -> str:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium") or ""):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("no Chromium found (install it with `apt-get install -y chromium`)")


def test_served_and_opened_in_chromium(imported: dict[str, Any]) -> None:
    from tests.api.conftest import LiveServer

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = _chromium()
    with LiveServer(imported["root"]) as server:
        listed = {r["sae_id"]: r for r in httpx.get(server.url + "/saes").json()}
        assert listed[GOOD]["architecture"] == "jumprelu" and listed[GOOD]["suspect"] is False
        assert listed[GOOD]["source"].endswith("average_l0_4")
        assert listed[SUSPECT]["suspect"] is True and listed[SUSPECT]["d_sae"] == NARROW
        assert listed[imported["sae_id"]]["architecture"] == "batchtopk"
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server.url + f"/saes/{GOOD}/features/3")
            page.wait_for_selector("#examples")
            assert page.inner_text("#feature-title") == f"{GOOD} / feature 3"
            assert page.locator("#suspect-mark").count() == 0
            assert page.locator("#cross-layer a.feat").count() >= 1
            page.goto(server.url + f"/saes/{SUSPECT}/features/2")
            page.wait_for_selector("#suspect-mark")
            assert "suspect" in page.inner_text("#suspect-mark")
            page.goto(server.url + "/#/saes")
            page.wait_for_selector("span.suspect")
            assert page.locator("span.suspect").count() == 1
            browser.close()
        assert not errors, errors


def test_cli_import_and_its_errors(imported: dict[str, Any], tmp_path: Path) -> None:
    from sae_atlas.api.cli import app

    runner = CliRunner()
    root = str(imported["root"])
    source = write_gemma_scope(tmp_path / "gemma-scope-tiny-res" / "layer_1" / "width_64" / "cli", imported["w"])
    ok = runner.invoke(app, ["import", root, str(source), "--id", "cli-import", "--no-model", "--json"])
    assert ok.exit_code == 0, ok.output
    assert '"sae_id": "cli-import"' in ok.output and "cli-import" in AtlasLayout(root).sae_ids()
    stripped = write_gemma_scope(tmp_path / "gemma-scope-tiny-res" / "layer_1" / "width_64" / "bad", imported["w"],
                                 threshold=False)
    refused = runner.invoke(app, ["import", root, str(stripped), "--no-model"])
    assert refused.exit_code == 2 and "threshold" in refused.output
    unknown = runner.invoke(app, ["import", root, "no-such-release/x"])
    assert unknown.exit_code == 2 and "unknown release" in unknown.output
    old = runner.invoke(app, ["import", "no-such-release/x", "--atlas", root])  # the old spelling: still SOURCE
    assert old.exit_code == 2 and "unknown release" in old.output and "--atlas is deprecated" in old.output
    missing = runner.invoke(app, ["import", str(tmp_path / "no-atlas"), "no-such-release/x"])
    assert missing.exit_code == 2 and "not an atlas" in missing.output
