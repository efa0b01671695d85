"""Atlas.contrast on the small atlas: the statistics match a brute-force recomputation,
a planted word difference is found and a same-distribution split finds nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from sae_atlas import Atlas
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.geometry.contrast import auroc
from sae_atlas.saes.formats import load_any
from sae_atlas.store.layout import AtlasLayout

COLOURS = ["red", "blue", "green", "yellow", "black", "white", "purple", "brown"]
CAT = [f"the cat is {c} and the {c} box" for c in COLOURS]
CHAIR = [f"the chair is {c} and the {c} box" for c in COLOURS]


@pytest.fixture(scope="module")
def atlas(small_atlas: dict[str, Any]) -> Atlas:
    return Atlas(small_atlas["root"])


def _max_pooled(atlas: Atlas, small_atlas: dict[str, Any], sae_id: str, hook: str, texts: list[str]) -> np.ndarray:
    sae = load_any(AtlasLayout(small_atlas["root"]).require_sae(sae_id))
    rows = []
    for text in texts:  # one text at a time: no padding involved
        _, cache = atlas.model().bridge.run_with_cache(atlas.model().to_tokens(text), names_filter=lambda n: n == hook)
        rows.append(sae.encode(cache[hook][0]).detach().amax(0).numpy())
    return np.stack(rows)


def test_contrast_matches_brute_force_and_finds_the_planted_word(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    result = atlas.contrast(CAT, CHAIR, k=10, n_permutations=2000)
    assert result.n_significant > 0 and result.table["significant"][0]
    assert result.table["rank"].to_list() == list(range(len(result.table)))
    for row in result.table:
        hook = small_atlas["hooks"][small_atlas["sae_ids"].index(row["sae_id"])]
        a = _max_pooled(atlas, small_atlas, row["sae_id"], hook, CAT)[:, row["latent"]]
        b = _max_pooled(atlas, small_atlas, row["sae_id"], hook, CHAIR)[:, row["latent"]]
        assert row["mean_a"] == pytest.approx(a.mean(), rel=1e-4, abs=1e-5)
        assert row["mean_b"] == pytest.approx(b.mean(), rel=1e-4, abs=1e-5)
        assert row["auroc"] == pytest.approx(float(auroc(a[:, None], b[:, None])[0]))
    assert "contrast" in result._repr_html_() and result.to_dict()["features"][0]["rank"] == 0


def test_a_split_of_one_distribution_finds_nothing(atlas: Atlas) -> None:
    result = atlas.contrast(CAT[:4] + CHAIR[:4], CAT[4:] + CHAIR[4:], k=5, n_permutations=2000)
    assert result.n_significant == 0 and not result.table["significant"].any()


def test_contrast_bad_input(atlas: Atlas) -> None:
    with pytest.raises(InvalidInputError, match="texts_a: List should have at least 2 items"):
        atlas.contrast(["only one"], CHAIR)
    with pytest.raises(InvalidInputError, match="texts_a.1: needs at least one non-space character"):
        atlas.contrast(["a", " "], CHAIR)
    with pytest.raises(InvalidInputError, match="pool: Input should be 'max' or 'mean'"):
        atlas.contrast(CAT, CHAIR, pool="median")  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        atlas.contrast(CAT, CHAIR, saes=["no-such-sae"])


def test_padding_does_not_change_pooled_activations(atlas: Atlas, small_atlas: dict[str, Any]) -> None:
    from sae_atlas.saes.encoding.texts import pooled_feature_acts

    sae_id, hook = small_atlas["sae_ids"][1], small_atlas["hooks"][1]
    texts = ["the cat", "the cat is red and the red box is on the table"]
    sae = load_any(AtlasLayout(small_atlas["root"]).require_sae(sae_id))
    with torch.inference_mode():
        batched = pooled_feature_acts(atlas.model(), {sae_id: sae}, {sae_id: hook}, texts, pool="mean")[sae_id]
        single = [pooled_feature_acts(atlas.model(), {sae_id: sae}, {sae_id: hook}, [t], pool="mean")[sae_id][0]
                  for t in texts]
    assert np.allclose(batched, np.stack(single), atol=1e-5)


def test_contrast_over_http_and_cli(server: Any, small_atlas: dict[str, Any], tmp_path: Any) -> None:
    import json

    import httpx
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    body = {"texts_a": CAT, "texts_b": CHAIR, "k": 3, "n_permutations": 2000}
    answer = httpx.post(server.url + "/search/contrast", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    features = answer.json()["features"]
    assert len(features) == 3 and features[0]["significant"] and features[0]["rank"] == 0
    bad = httpx.post(server.url + "/search/contrast", json={**body, "texts_a": ["one"]}, timeout=30)
    assert bad.status_code == 422 and "texts_a" in bad.text
    bad = httpx.post(server.url + "/search/contrast", json={**body, "sae_ids": ["nope"]}, timeout=30)
    assert bad.status_code == 404

    (tmp_path / "a.json").write_text(json.dumps(CAT))
    (tmp_path / "b.txt").write_text("\n".join(CHAIR))
    args = ["search", "contrast", str(small_atlas["root"]), str(tmp_path / "a.json"), str(tmp_path / "b.txt"),
            "-k", "3", "--permutations", "2000", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert [f["latent"] for f in json.loads(out.output)["features"]] == [f["latent"] for f in features]
    missing = CliRunner().invoke(app, ["search", "contrast", str(small_atlas["root"]), "nofile", "nofile"])
    assert missing.exit_code != 0 and "not a file" in missing.output
