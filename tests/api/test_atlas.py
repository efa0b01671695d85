"""The Atlas facade against brute-force recomputation on the small atlas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sae_atlas import Atlas
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.formats import load_any
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import FeatureTables


@pytest.fixture(scope="module")
def atlas(small_atlas: dict[str, Any]) -> Atlas:
    return Atlas(small_atlas["root"])


def _unit_decoder(small_atlas: dict[str, Any], sae_id: str) -> np.ndarray:
    W = load_any(AtlasLayout(small_atlas["root"]).require_sae(sae_id)).W_dec.detach().numpy()
    return W / np.linalg.norm(W, axis=1, keepdims=True)


def test_saes_and_feature_card(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    frame = atlas.saes()
    assert frame["sae_id"].to_list() == sorted(small_atlas["sae_ids"])
    assert set(frame["hook"]) == set(small_atlas["hooks"])
    sae = small_atlas["sae_ids"][0]
    tables = FeatureTables(small_atlas["root"], sae)
    latent = int(tables.features.sort("n_active", descending=True)["latent"][0])
    f = atlas.feature(sae, latent, examples=3, neighbours=4)
    row = tables.feature(latent)
    assert f.stats["n_active"] == row["n_active"] and f.stats["max_act"] == pytest.approx(row["max_act"])
    assert len(f.examples) == 3 and f.examples[0]["act"] == pytest.approx(row["max_act"])
    assert f.examples[0]["acts"][f.examples[0]["centre"]] == pytest.approx(f.examples[0]["act"])
    assert [t["token_id"] for t in f.top_logits] == row["top_logit_ids"]
    assert sum(f.histogram["counts"]) == row["n_active"]
    assert len(f.histogram["edges"]) == len(f.histogram["counts"]) + 1
    assert len(f.neighbours) == 4 and all(n["latent"] != latent for n in f.neighbours)
    assert {c["sae_id"] for c in f.cross_layer} == {small_atlas["sae_ids"][1]}
    assert f.map_position["latent"] == latent
    html = f._repr_html_()
    assert "rgba(255,140,0" in html and f"feature {latent}" in html
    assert f.plot() is not None
    assert f.to_dict()["index"] == latent


def test_similar_matches_brute_force(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][1]
    unit = _unit_decoder(small_atlas, sae)
    cos = unit @ unit[7]
    cos[7] = -np.inf
    expected = np.argsort(-cos)[:5]
    got = atlas.similar(sae, 7, k=5)
    assert got["latent"].to_list() == expected.tolist()
    np.testing.assert_allclose(got["cosine"].to_numpy(), cos[expected], atol=1e-5)


def test_vector_and_flow(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    a, b = small_atlas["sae_ids"]
    unit_b = _unit_decoder(small_atlas, b)
    hits = atlas.search_vector(unit_b[11] * 3.0, k=3)
    assert (hits["sae_id"][0], hits["latent"][0]) == (b, 11)
    assert hits["cosine"][0] == pytest.approx(1.0, abs=1e-5)
    flow = atlas.flow(a, 5, k=2)
    unit_a = _unit_decoder(small_atlas, a)
    assert flow["sae_id"].unique().to_list() == [b]
    assert flow["latent"][0] == int(np.argmax(unit_b @ unit_a[5]))
    with pytest.raises(InvalidInputError, match="d_in is 32"):
        atlas.search_vector([1.0] * 5)
    with pytest.raises(InvalidInputError, match="not all zero"):
        atlas.search_vector([0.0] * 32)


def test_search_text_matches_direct_encoding(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][1]
    result = atlas.search_text("the cat sat on the mat", saes=[sae], k=3)
    assert result.tokens == ["the", "cat", "sat", "on", "the", "mat"] and result.positions == [1, 2, 3, 4, 5, 6]
    handle = atlas.model()
    _, cache = handle.bridge.run_with_cache(handle.to_tokens("the cat sat on the mat"),
                                            names_filter=lambda n: n == small_atlas["hooks"][1])
    f = load_any(AtlasLayout(small_atlas["root"]).require_sae(sae)).encode(cache[small_atlas["hooks"][1]][0]).detach()
    for pos, feats in zip(result.positions, result.features[sae], strict=True):
        assert feats[0]["latent"] == int(f[pos].argmax())
        assert feats[0]["act"] == pytest.approx(float(f[pos].max()), rel=1e-4)
    frame = result.frame
    assert frame.height == sum(len(x) for x in result.features[sae])
    assert "cat" in result._repr_html_()
    with pytest.raises(InvalidInputError, match="text: String should have at most 2000 characters"):
        atlas.search_text("a " * 2000)


def test_search_token(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][0]
    tables = FeatureTables(small_atlas["root"], sae)
    row = tables.feature(0)
    token_id, token = row["top_logit_ids"][0], row["top_logit_tokens"][0]
    result = atlas.search_token(token, sae_id=sae, k=100)
    assert result.token_id == token_id
    assert 0 in result.promoting["latent"].to_list()
    assert result.promoting["logit"].is_sorted(descending=True)
    assert atlas.search_token(token_id, sae_id=sae).token_id == token_id
    with pytest.raises(NotFoundError):
        atlas.search_token("no-such-token-xyz")


def test_analyses_and_errors(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    runs = atlas.analyses()
    assert ("planted", "demo-run") in list(zip(runs["kind"], runs["run"], strict=True))
    result = atlas.analysis("planted", "demo-run")
    assert isinstance(result.table, pl.DataFrame) and result.table.height == 2
    assert [p.name for p in result.figures] == ["demo-run.png"]
    assert "data:image/png;base64" in result._repr_html_()
    with pytest.raises(NotFoundError, match="demo-run"):
        atlas.analysis("planted", "other")
    with pytest.raises(InvalidInputError):
        atlas.analysis("../etc", "x")
    with pytest.raises(NotFoundError, match="valid"):
        atlas.feature("nope", 0)
    with pytest.raises(NotFoundError, match="valid 0..63"):
        atlas.feature(small_atlas["sae_ids"][0], 64)
    with pytest.raises(InvalidInputError, match="must be an integer"):
        atlas.feature(small_atlas["sae_ids"][0], "3")
    with pytest.raises(InvalidInputError, match="k: Input should be less than or equal to 100"):
        atlas.similar(small_atlas["sae_ids"][0], 0, k=1000)
    with pytest.raises(NotFoundError, match="not an atlas"):
        Atlas(small_atlas["root"] / "missing")


def test_searched_and_run_tokens_are_decoded_strings(small_atlas: dict[str, Any], tmp_path: Path) -> None:
    """A byte-level BPE tokenizer writes ' october' as the piece 'Ġoctober': text search and
    interventions show the decoded string, in Python and over HTTP."""
    from starlette.testclient import TestClient

    from sae_atlas.api.http import ServerSettings, create_app
    from sae_atlas.saes.models import tiny_model
    from tests.saes.test_encoding_tokens import TEXT, byte_level_tokenizer

    handle = tiny_model(n_layers=2, d_model=32)
    handle.bridge.tokenizer = handle.tokenizer = byte_level_tokenizer(tmp_path / "tokenizer")
    pieces = handle.tokenizer.convert_ids_to_tokens(handle.to_tokens(TEXT)[0].tolist())
    assert any(p.startswith("Ġ") for p in pieces)  # the tokenizer really has byte-level pieces
    atlas = Atlas(small_atlas["root"], model=handle)
    found = atlas.search_text(TEXT, k=2)
    assert "".join(found.tokens) == TEXT and not any("Ġ" in t for t in found.tokens)
    assert found.tokens == [handle.tokenizer.decode([i]) for i in found.token_ids]
    assert atlas.run(TEXT, sae_ids=[small_atlas["sae_ids"][0]]).tokens[1:] == found.tokens
    app = create_app(ServerSettings(root=small_atlas["root"]))
    app.state.atlas = atlas  # the same model override behind the HTTP route
    with TestClient(app) as http:
        assert http.post("/search/text", json={"text": TEXT, "k": 2}).json()["tokens"] == found.tokens
