"""Offline labels and label search on the small atlas: labels are deterministic and follow
the summary tables, a planted explanation is found by a word, and labels show on feature
pages and in search results (Python, CLI, HTTP)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sae_atlas import Atlas
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.labels import DEAD, auto_labels
from sae_atlas.store.feature_records import read_records, record_paths
from sae_atlas.store.tables import FeatureTables


@pytest.fixture(scope="module")
def labelled(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Atlas, dict[str, Any]]:
    """A copy of the small atlas (labels are written into it) with labels built."""
    root = tmp_path_factory.mktemp("labels") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    atlas = Atlas(root)
    assert atlas.build_labels() == {s: small_atlas["d_sae"] for s in small_atlas["sae_ids"]}
    return atlas, {**small_atlas, "root": root}


def test_auto_labels_follow_the_tables(labelled: tuple[Atlas, dict[str, Any]]) -> None:
    atlas, facts = labelled
    sae_id = facts["sae_ids"][1]
    tables = FeatureTables(facts["root"], sae_id)
    labels = auto_labels(tables.features, tables.examples)
    assert labels.equals(auto_labels(tables.features, tables.examples))  # deterministic
    for row in tables.features.select("latent", "n_active", "top_logit_tokens").iter_rows(named=True):
        text = labels.filter(pl.col("latent") == row["latent"])["text"][0]
        if row["n_active"] == 0:
            assert text == DEAD
        else:
            assert f'promotes "{row["top_logit_tokens"][0].strip()}"' in text
            top = tables.examples_for(row["latent"], "top")
            centres = [t[c].strip() for t, c in zip(top["tokens"], top["centre"], strict=True)]
            most = max(set(centres), key=lambda t: (centres.count(t), -min(i for i, c in enumerate(centres) if c == t)))
            assert f'"{most}"' in text.split(" · ")[0]
    stored = read_records(facts["root"], sae_id, "labels")
    assert stored.filter(pl.col("source") == "auto").sort("latent")["text"].equals(labels["text"])


def test_label_search_finds_a_planted_explanation(labelled: tuple[Atlas, dict[str, Any]], tmp_path: Path) -> None:
    atlas, facts = labelled
    a, b = facts["sae_ids"]
    (tmp_path / "np.json").write_text(json.dumps([
        {"modelId": "tiny", "layer": "1-res", "index": "17", "description": "days of the week, especially weekdays"},
        {"modelId": "tiny", "layer": "1-res", "index": "3", "description": "numbers and counting"},
    ]))
    (tmp_path / "mine.csv").write_text("feature,explanation\n5,colour words like red\n9,weekday names in dates\n")
    assert atlas.import_explanations(b, tmp_path / "np.json", source="neuronpedia") == 2
    assert atlas.import_explanations(a, tmp_path / "mine.csv") == 2
    hits = atlas.search_labels("weekday", k=5)
    assert set(zip(hits["sae_id"], hits["latent"], strict=True)) == {(b, 17), (a, 9)}
    assert hits["score"].to_list() == sorted(hits["score"].to_list(), reverse=True)
    assert atlas.search_labels("counting numbers", saes=[b], k=1)["latent"].to_list() == [3]
    assert atlas.feature(b, 17).explanations == ["days of the week, especially weekdays"]
    assert atlas.feature(b, 17).label  # the offline label is shown too
    similar = atlas.similar(b, 17, k=3)
    assert similar["label"].null_count() == 0
    # re-importing a source replaces it; the offline labels stay
    (tmp_path / "np.json").write_text(json.dumps({"explanations": [{"index": 4, "description": "punctuation"}]}))
    atlas.import_explanations(b, tmp_path / "np.json", source="neuronpedia")
    assert (b, 17) not in set(zip(*atlas.search_labels("weekday").frame[["sae_id", "latent"]].to_dict().values(), strict=True))
    assert read_records(facts["root"], b, "labels").filter(pl.col("source") == "auto").height == facts["d_sae"]


def test_label_search_bad_input(labelled: tuple[Atlas, dict[str, Any]], tmp_path: Path) -> None:
    atlas, facts = labelled
    with pytest.raises(InvalidInputError, match="letter or digit"):
        atlas.search_labels("  !! ")
    (tmp_path / "bad.csv").write_text("feature,explanation\n999,out of range\n")
    with pytest.raises(InvalidInputError, match="out of range"):
        atlas.import_explanations(facts["sae_ids"][0], tmp_path / "bad.csv")
    (tmp_path / "bad.json").write_text("[{\"index\": 1}]")
    with pytest.raises(InvalidInputError, match="description"):
        atlas.import_explanations(facts["sae_ids"][0], tmp_path / "bad.json")


def test_labels_cli_and_http(labelled: tuple[Atlas, dict[str, Any]], tmp_path: Path) -> None:
    import httpx
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app
    from tests.api.conftest import LiveServer

    atlas, facts = labelled
    b = facts["sae_ids"][1]
    (tmp_path / "x.csv").write_text("feature,explanation\n12,planets and moons of the solar system\n")
    out = CliRunner().invoke(app, ["search", "labels", str(facts["root"]), "planet", "--sae", b,
                                   "--import", str(tmp_path / "x.csv"), "--json"])
    assert out.exit_code == 0, out.output
    assert [h["latent"] for h in json.loads(out.output[out.output.index("["):])] == [12]
    bad = CliRunner().invoke(app, ["search", "labels", str(facts["root"]), "--import", str(tmp_path / "x.csv")])
    assert bad.exit_code != 0 and "one --sae" in bad.output
    with LiveServer(facts["root"]) as live:
        hits = httpx.get(live.url + "/search/labels", params={"query": "solar planets", "k": 3}, timeout=30).json()
        assert [(h["sae_id"], h["latent"]) for h in hits] == [(b, 12)]
        page = httpx.get(f"{live.url}/saes/{b}/features/12", timeout=30).json()
        assert page["explanations"] == ["planets and moons of the solar system"] and page["label"]
        assert httpx.get(live.url + "/search/labels", params={"query": "!!"}, timeout=30).status_code in (400, 422)


def test_explorer_label_search_opens_a_labelled_feature(labelled: tuple[Atlas, dict[str, Any]], tmp_path: Path) -> None:
    from tests.api.conftest import LiveServer
    from tests.api.test_browser import CHROMIUM_ARGS, _chromium

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    atlas, facts = labelled
    b = facts["sae_ids"][1]
    (tmp_path / "y.csv").write_text("feature,explanation\n21,rivers and lakes\n")
    atlas.import_explanations(b, tmp_path / "y.csv", source="browser")
    executable = _chromium()
    with LiveServer(facts["root"]) as live, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(live.url + "/#/labels")
        page.fill("#label-query", "rivers")
        page.press("#label-query", "Enter")
        page.wait_for_selector("#label-hits a.feat")
        page.click("#label-hits a.feat")
        page.wait_for_selector("#feature-label")
        assert page.inner_text("#feature-title") == f"{b} / feature 21"
        assert "rivers and lakes" in page.inner_text(".explanation")
        assert page.query_selector("#geometry") is not None
        # the map: label words highlight matching points, colouring switches to circle membership
        page.goto(f"{live.url}/#/map/{b}")
        page.wait_for_selector("#map-canvas[data-points]")
        assert page.get_attribute("#map-canvas", "data-highlighted") == "0"
        page.fill("#map-search", "rivers")
        page.press("#map-search", "Enter")
        page.wait_for_selector('#map-canvas[data-highlighted="1"]')
        page.select_option("#map-colour", "in a circle")
        assert "kNN overlap" in page.inner_text("#map-note")
        browser.close()
    assert not errors, errors


def test_client_meaning_searches_mirror_the_atlas(labelled: tuple[Atlas, dict[str, Any]]) -> None:
    from sae_atlas.api.client import AtlasClient
    from tests.api.conftest import LiveServer

    atlas, facts = labelled
    b = facts["sae_ids"][1]
    texts_a = ["the cat is red", "the cat is blue", "the cat is green"]
    texts_b = ["the chair is red", "the chair is blue", "the chair is green"]
    with LiveServer(facts["root"]) as live, AtlasClient(live.url) as client:
        remote = client.contrast(texts_a, texts_b, saes=[b], k=5, n_permutations=500)
        local = atlas.contrast(texts_a, texts_b, saes=[b], k=5, n_permutations=500)
        assert [f["latent"] for f in remote["features"]] == local.table["latent"].to_list()
        remote_c = client.concept_search("weekdays", saes=[b], min_selectivity=0.3)
        assert remote_c["per_sae"][b]["span"] == atlas.concept_search("weekdays", saes=[b], min_selectivity=0.3).per_sae[b]["span"]
        assert client.search_labels("promotes", k=3)["latent"].to_list() == atlas.search_labels("promotes", k=3)["latent"].to_list()
        assert client.geometry_features(b).height == len(atlas.geometry_features(b))


def test_summarize_builds_labels_and_search_says_when_there_are_none(small_atlas: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app
    from sae_atlas.errors import NotFoundError

    root = tmp_path / "atlas"
    shutil.copytree(small_atlas["root"], root)
    sae_id = small_atlas["sae_ids"][0]
    for sid in small_atlas["sae_ids"]:
        for path in record_paths(root, sid, "labels"):
            path.unlink()
    with pytest.raises(NotFoundError, match="--rebuild"):
        Atlas(root).search_labels("weekday")
    out = CliRunner().invoke(app, ["summarize", str(root), "--sae", sae_id, "--force", "--no-model"])
    assert out.exit_code == 0, out.output
    stored = read_records(root, sae_id, "labels")
    assert stored.height == small_atlas["d_sae"] and set(stored["source"]) == {"auto"}
    tables = FeatureTables(root, sae_id)
    assert stored["text"].to_list() == auto_labels(tables.features, tables.examples)["text"].to_list()
    hits = Atlas(root).search_labels(stored["text"][0], saes=[sae_id], k=1)
    assert hits["latent"].to_list() == [0]
