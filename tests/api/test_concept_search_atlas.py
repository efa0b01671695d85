"""Atlas.concept_search on the small atlas: per-SAE concept features equal a direct
recomputation at the concept tokens, the run is stored, and CLI / HTTP answer the same."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl
import pytest

from sae_atlas import Atlas
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.concept_search import concept_features
from sae_atlas.saes.formats import load_any
from sae_atlas.saes.intervene.concepts import CategoryConcept, colours, load_concept
from sae_atlas.store.layout import AtlasLayout


@pytest.fixture(scope="module")
def atlas(small_atlas: dict[str, Any]) -> Atlas:
    return Atlas(small_atlas["root"])


def _direct_features(atlas: Atlas, small_atlas: dict[str, Any], sae_index: int, concept: CategoryConcept) -> np.ndarray:
    """Feature activations at each prompt's value token, one prompt at a time (tiny vocab:
    one token per word)."""
    sae_id, hook = small_atlas["sae_ids"][sae_index], small_atlas["hooks"][sae_index]
    sae = load_any(AtlasLayout(small_atlas["root"]).require_sae(sae_id))
    handle = atlas.model()
    rows = []
    for prompt in concept.prompts():
        tokens = handle.to_tokens(prompt.text)
        words = handle.tokenizer.convert_ids_to_tokens(tokens[0].tolist())
        pos = words.index(concept.values[prompt.value].lower())
        _, cache = handle.bridge.run_with_cache(tokens, names_filter=lambda n: n == hook)
        rows.append(sae.encode(cache[hook][0, pos]).detach().numpy())
    return np.stack(rows)


def test_categories_match_direct_encoding_and_are_stored(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    vocab = atlas.model().tokenizer.get_vocab()
    concept = colours()
    concept.values = [v for v in concept.values if v in vocab]  # the tiny vocabulary has some colours
    assert len(concept.values) >= 3
    result = atlas.concept_search(concept, min_selectivity=0.3, save="colours-test")
    assert result.kind == "categories" and set(result.per_sae) == set(small_atlas["sae_ids"])
    assert result.best in result.per_sae
    for i, sae_id in enumerate(small_atlas["sae_ids"]):
        direct = concept_features(_direct_features(atlas, small_atlas, i, concept),
                                  np.array([p.value for p in concept.prompts()]), min_selectivity=0.3)
        mine = result.features.frame.filter(pl.col("sae_id") == sae_id)
        assert sorted(mine["latent"].to_list()) == sorted(direct["latent"].to_list())
        assert set(mine.filter(mine["selective"])["latent"].to_list()) == set(
            direct.filter(direct["selective"])["latent"].to_list())
        summary = result.per_sae[sae_id]
        span = mine.filter(mine["span_order"].is_not_null()).sort("span_order")["latent"].to_list()
        assert span == summary["span"] and len(span) <= 8
        if summary["span"]:
            assert 0 <= summary["fit"]["lda_accuracy"] <= 1 and summary["fit"]["chance"] == 1 / len(concept.values)
    stored = atlas.analysis("concept_search", "colours-test")
    assert stored.table.height == len(result.features) and stored.meta["summary"]["best"] == result.best
    assert json.dumps(result.to_dict())  # JSON-ready


def test_ordered_concept_reports_a_circle_fit(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    sae_id = small_atlas["sae_ids"][1]
    result = atlas.concept_search(load_concept("weekdays"), saes=[sae_id], min_selectivity=0.3)
    summary = result.per_sae[sae_id]
    assert result.kind == "ordered" and summary["span"]
    assert {"r2", "r2_loo", "cyclic_order", "fitted_period"} <= set(summary["fit"])
    assert summary["explained"] == sorted(summary["explained"])


def test_concept_search_bad_input(atlas: Atlas) -> None:
    with pytest.raises(InvalidInputError, match="unknown concept"):
        atlas.concept_search("planets")
    with pytest.raises(InvalidInputError, match="target"):
        atlas.concept_search("colours", target=0)
    with pytest.raises(InvalidInputError, match="2 distinct values"):
        atlas.concept_search({"kind": "categories", "values": ["red"], "templates": ["{value}"]})


def test_concept_search_cli(small_atlas: dict[str, Any], tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    spec = tmp_path / "c.json"
    spec.write_text(json.dumps({"name": "pets", "kind": "categories", "values": ["cat", "dog", "horse"],
                                "templates": ["the {value} is red", "we saw a {value} in the park",
                                              "a {value} is a kind of animal"]}))
    out = CliRunner().invoke(app, ["search", "concept", str(small_atlas["root"]), str(spec), "--json",
                                   "--min-selectivity", "0.3"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["kind"] == "categories" and body["concept"]["name"] == "pets"
    assert all("lda_accuracy" in s["fit"] or s["span"] == [] for s in body["per_sae"].values())
    bad = CliRunner().invoke(app, ["search", "concept", str(small_atlas["root"]), "planets"])
    assert bad.exit_code != 0 and "unknown concept" in bad.output


def test_concept_search_over_http(server: Any, small_atlas: dict[str, Any]) -> None:
    import httpx

    sae_id = small_atlas["sae_ids"][0]
    body = {"concept": {"name": "pets", "kind": "categories", "values": ["cat", "dog", "horse"],
                        "templates": ["the {value} is red", "we saw a {value} in the park", "a {value} is a kind of animal"]},
            "sae_ids": [sae_id], "min_selectivity": 0.3}
    answer = httpx.post(server.url + "/search/concept", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["kind"] == "categories" and data["best"] == sae_id and set(data["per_sae"]) == {sae_id}
    assert all(f["sae_id"] == sae_id for f in data["features"])
    builtin = httpx.post(server.url + "/search/concept", json={"concept": "weekdays", "sae_ids": [sae_id]}, timeout=60)
    assert builtin.status_code == 200 and builtin.json()["kind"] == "ordered"
    bad = httpx.post(server.url + "/search/concept", json={**body, "concept": "planets"}, timeout=30)
    assert bad.status_code == 422
    for concept in ({**body["concept"], "templates": ["no slot here"]},  # every template needs one {value}
                    {**body["concept"], "values": ["cat", "cat", "dog"]},  # distinct values
                    {**body["concept"], "kind": "ordered", "values": ["cat", "dog"]}):  # a cycle needs 3
        bad = httpx.post(server.url + "/search/concept", json={**body, "concept": concept}, timeout=30)
        assert bad.status_code == 422, (concept, bad.text)


def test_saved_concept_run_becomes_geometry_records(atlas: Atlas, small_atlas: dict[str, Any], server: Any) -> None:
    import httpx

    sae_id = small_atlas["sae_ids"][1]
    result = atlas.concept_search("weekdays", saes=[sae_id], min_selectivity=0.3, save="week-geom")
    selective = set(result.features.frame.filter(pl.col("selective"))["latent"].to_list())
    assert selective
    records = atlas.geometry_features(sae_id, kind="concept").frame.filter(pl.col("run") == "week-geom")
    assert set(records["latent"].to_list()) == selective
    cyclic = bool(result.per_sae[sae_id]["fit"].get("cyclic_order"))
    assert set(atlas.geometry_features(sae_id, in_circle=True)["latent"].to_list()) >= (selective if cyclic else set())
    latent = min(selective)
    page = atlas.feature(sae_id, latent)
    assert any(r["kind"] == "concept" and r["run"] == "week-geom" for r in page.geometry)
    served = httpx.get(f"{server.url}/saes/{sae_id}/features/{latent}", timeout=30).json()
    assert any(r["run"] == "week-geom" for r in served["geometry"])
    listed = httpx.get(f"{server.url}/search/geometry", params={"sae_id": sae_id, "kind": "concept"}, timeout=30)
    assert listed.status_code == 200 and {r["latent"] for r in listed.json() if r["run"] == "week-geom"} == selective
