"""What the Compare page reads, over HTTP and from Python: a stored comparison's correlation
histogram beside its rotation null, each side's feature card (side B from another atlas, and
a clear 404 once that atlas is gone), and a planted crosscoder whose latents copy known SAE
decoder rows: its class filter, sorting, Latent Scaling columns, and the card's nearest
features, which must be the copied rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
from starlette.testclient import TestClient
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.api.services.crosscoder import KIND, crosscoder_dir
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.compare.crosscoder import CROSSCODER_FILE, crosscoder_config, relative_norms
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats.saelens import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.atomic import atomic_write_json
from tests.saes.compare_fixtures import one_thread  # noqa: F401

OPTIONS = {"n_tokens": 1024, "sample_tokens": 128, "n_perm": 5, "min_fires": 0, "corpus": CorpusSpec(context_size=32)}
CC = "planted"
COPIED = {"a": [5, 6, 7, 8], "b": [9, 10, 11, 12]}  # SAE latents whose decoder rows the planted latents copy


def planted_crosscoder(root: Path, sae_ids: list[str], hooks: list[str]) -> None:
    """A crosscoder between the two hooks of the atlas's model, stored as `train-crosscoder`
    stores one: latents 0-3 copy SAE 0's rows COPIED["a"] on side A (A-only), latents 4-7 SAE
    1's rows COPIED["b"] on side B (B-only), latents 8-11 both (shared); the table carries two
    Latent Scaling columns and a text column (left out of `scaling`)."""
    atlas = Atlas(root)
    W_a, W_b = (atlas.sae(s).module().W_dec.detach() for s in sae_ids)
    gen = torch.Generator().manual_seed(0)
    small = 0.01 * torch.randn(12, 32, generator=gen)
    dec_a = torch.cat([W_a[COPIED["a"]], small[4:8], W_a[COPIED["a"]]])
    dec_b = torch.cat([small[:4], W_b[COPIED["b"]], W_b[COPIED["b"]]])
    sae = build_sae(crosscoder_config(32, 32, 12, 2, hook_name=hooks[0])).eval()
    with torch.no_grad():
        sae.W_dec.copy_(torch.cat([dec_a, dec_b], dim=1))
    folder = crosscoder_dir(root, CC)
    save_saelens(sae, folder)
    sides = {"model_a": "tiny", "hook_a": hooks[0], "model_b": "tiny", "hook_b": hooks[1], "spec_b": None}
    atomic_write_json(folder / CROSSCODER_FILE, {"d_a": 32, "d_b": 32, "scale_a": 1.0, "scale_b": 1.0, "sides": sides})
    norms = relative_norms(sae, 32)
    table = pl.DataFrame({"latent": np.arange(12, dtype=np.int32), "norm_a": norms.norm_a, "norm_b": norms.norm_b,
                          "relative_norm": norms.relative, "latent_class": norms.latent_class,
                          "beta_error": np.linspace(0, 1, 12), "nu_error": np.arange(12) / 100.0,
                          "note": ["planted"] * 12})  # not a number: not sent
    counts = {c: int((norms.latent_class == c).sum()) for c in ("a_only", "shared", "b_only")}
    write_analysis(root, KIND, CC, parameters={**sides, "d_sae": 12, "k": 2, "n_tokens": 1000},
                   summary=counts, tables={"main": table})


@pytest.fixture(scope="module")
def compared(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the small atlas with two comparisons (its two layers; its first SAE against
    the same SAE of a second copy, B) and the planted crosscoder."""
    base = tmp_path_factory.mktemp("compare-pages")
    root = Path(shutil.copytree(small_atlas["root"], base / "atlas"))
    other = Path(shutil.copytree(small_atlas["root"], base / "other"))
    a, b = small_atlas["sae_ids"]
    atlas = Atlas(root)
    layers = atlas.compare(root, sae=a, other_sae=b, run="layers", **OPTIONS)
    copy = atlas.compare(other, sae=a, other_sae=a, run="copy", **OPTIONS)
    planted_crosscoder(root, small_atlas["sae_ids"], small_atlas["hooks"])
    return {"root": root, "other": other, "sae_ids": small_atlas["sae_ids"], "layers": layers, "copy": copy}


def test_the_correlation_histogram_counts_every_pair_beside_the_rotation_null(compared: dict[str, Any]) -> None:
    result = compared["layers"]
    h = result.correlations
    assert len(h["edges"]) == len(h["pairs"]) + 1 == len(h["null"]) + 1 and h["edges"][-1] == 1.0
    assert sum(h["pairs"]) == len(result.pairs) == 64  # every pair, not only the ones sent
    assert sum(h["null"]) == 64  # one rotation, one Hungarian pair per latent
    copy = compared["copy"].correlations  # an SAE against its own copy: every live pair correlates 1
    alive = compared["copy"].pairs.frame.filter(pl.col("corr").is_finite() & (pl.col("corr") > 0.5)).height
    assert copy["pairs"][-1] == alive > 40 and copy["null"][-1] < alive
    with TestClient(create_app(ServerSettings(root=compared["root"]))) as http:
        sent = http.get("/compare/layers", params={"pairs": 5}).json()
    assert len(sent["pairs"]) == 5 and sent["correlations"]["pairs"] == h["pairs"]


def test_each_side_card_comes_from_its_own_atlas(compared: dict[str, Any], tmp_path: Path) -> None:
    root, other = compared["root"], compared["other"]
    a, b = compared["sae_ids"]
    pair = compared["copy"].pairs[0]
    assert pair["a_latent"] == pair["b_latent"]  # a copy matches each latent to itself
    latent = pair["a_latent"]
    with TestClient(create_app(ServerSettings(root=root))) as http:
        card_a = http.get(f"/compare/copy/a/features/{latent}").json()
        card_b = http.get(f"/compare/copy/b/features/{latent}", params={"examples": 3}).json()
        same = http.get(f"/compare/layers/b/features/{latent}").json()
        assert card_a["sae_id"] == card_b["sae_id"] == a and card_a["stats"] == card_b["stats"]
        assert len(card_b["examples"]) <= 3 and card_b["examples"] == card_a["examples"][:len(card_b["examples"])]
        assert same["sae_id"] == b and same["stats"] == Atlas(root).feature(b, latent).to_dict()["stats"]
        assert http.get("/compare/copy/c/features/0").status_code == 422
        assert http.get("/compare/nope/b/features/0").status_code == 404
        assert http.get("/compare/copy/b/features/9999").status_code == 404
        other.rename(tmp_path / "moved")
        try:
            gone = http.get(f"/compare/copy/b/features/{latent}")
            assert gone.status_code == 404 and str(other) in gone.json()["detail"] and "is gone" in gone.json()["detail"]
            assert http.get(f"/compare/copy/a/features/{latent}").status_code == 200
        finally:
            (tmp_path / "moved").rename(other)


def test_crosscoder_listing_filter_and_sort(compared: dict[str, Any]) -> None:
    with TestClient(create_app(ServerSettings(root=compared["root"]))) as http:
        listing = http.get("/crosscoders").json()
        assert listing == [{"crosscoder": CC, "model_a": "tiny", "hook_a": "blocks.0.hook_resid_post",
                            "model_b": "tiny", "hook_b": "blocks.1.hook_resid_post", "d_sae": 12, "k": 2,
                            "n_tokens": 1000, "a_only": 4, "shared": 4, "b_only": 4}]
        only_b = http.get(f"/crosscoders/{CC}/latents", params={"latent_class": "b_only"}).json()
        assert only_b["total"] == 4 and {r["latent"] for r in only_b["rows"]} == {4, 5, 6, 7}
        assert all(r["latent_class"] == "b_only" and r["relative_norm"] > 0.9 for r in only_b["rows"])
        rel = [r["relative_norm"] for r in only_b["rows"]]
        assert rel == sorted(rel, reverse=True)
        assert only_b["rows"][0]["scaling"].keys() == {"beta_error", "nu_error"}
        hist = only_b["histogram"]  # over every latent, whatever the filter
        assert sum(hist["b_only"]) == sum(hist["a_only"]) == sum(hist["shared"]) == 4
        assert sum(hist["a_only"][:5]) == 4 and sum(hist["b_only"][45:]) == 4  # below 0.1, above 0.9
        by_nu = http.get(f"/crosscoders/{CC}/latents", params={"sort": "nu_error", "descending": False,
                                                                 "limit": 3, "offset": 1}).json()
        assert [r["latent"] for r in by_nu["rows"]] == [1, 2, 3] and by_nu["total"] == 12
        assert http.get(f"/crosscoders/{CC}/latents", params={"latent_class": "c_only"}).status_code == 422
        bad_sort = http.get(f"/crosscoders/{CC}/latents", params={"sort": "latent_class"})
        assert bad_sort.status_code == 404 and "relative_norm" in bad_sort.json()["detail"]
        missing = http.get("/crosscoders/nope/latents")
        assert missing.status_code == 404 and CC in missing.json()["detail"]
        assert http.get(f"/crosscoders/{CC}/latents/12").status_code == 404
    page = Atlas(compared["root"]).crosscoder_latents(CC, latent_class="b_only", sort="nu_error")
    assert "4 b_only latents" in page._repr_html_() and "nu_error" in page._repr_html_()
    past_the_end = Atlas(compared["root"]).crosscoder_latents(CC, latent_class="a_only", offset=9)
    assert past_the_end.rows == [] and "4 a_only latents" in past_the_end._repr_html_()
    with pytest.raises(InvalidInputError, match="latent_class"):
        Atlas(compared["root"]).crosscoder_latents(CC, latent_class="only_b")  # type: ignore[arg-type]


def test_a_latent_card_shows_both_norms_and_the_copied_features(compared: dict[str, Any]) -> None:
    a, b = compared["sae_ids"]
    atlas = Atlas(compared["root"])
    for latent in range(12):
        card = atlas.crosscoder_latent(CC, latent, k=3)
        assert card.relative_norm == pytest.approx(card.norm_b / (card.norm_a + card.norm_b))
        assert card.scaling == {"beta_error": pytest.approx(latent / 11), "nu_error": pytest.approx(latent / 100)}
        assert not card.notes and len(card.nearest_a) == len(card.nearest_b) == 3
        if latent < 4 or latent >= 8:  # side A copies SAE a's row: found with cosine 1
            top = card.nearest_a[0]
            assert (top["sae_id"], top["latent"]) == (a, COPIED["a"][latent % 4]) and top["cosine"] == pytest.approx(1)
            assert top["label"] == atlas.feature(a, top["latent"]).label
        if latent >= 4:
            top = card.nearest_b[0]
            assert (top["sae_id"], top["latent"]) == (b, COPIED["b"][latent % 4]) and top["cosine"] == pytest.approx(1)
        assert all(n["sae_id"] == a for n in card.nearest_a) and all(n["sae_id"] == b for n in card.nearest_b)
    assert "latent 11" in card._repr_html_() and "nu_error" in card._repr_html_()
    with TestClient(create_app(ServerSettings(root=compared["root"]))) as http:
        body = http.get(f"/crosscoders/{CC}/latents/5", params={"k": 2}).json()
    assert body["latent_class"] == "b_only" and body["norm_b"] > 10 * body["norm_a"]
    assert body["nearest_b"][0]["latent"] == COPIED["b"][1] and len(body["nearest_a"]) == 2


def test_cli_lists_filters_and_shows_a_card(compared: dict[str, Any]) -> None:
    root = str(compared["root"])
    listing = CliRunner().invoke(app, ["search", "crosscoder", root, "--json"])
    assert listing.exit_code == 0, listing.output
    assert json.loads(listing.output)[0]["b_only"] == 4
    only = CliRunner().invoke(app, ["search", "crosscoder", root, CC, "--only", "b_only", "--limit", "2", "--json"])
    assert only.exit_code == 0, only.output
    body = json.loads(only.output)
    assert body["total"] == 4 and len(body["rows"]) == 2 and body["latent_class"] == "b_only"
    old = CliRunner().invoke(app, ["search", "crosscoder", root, CC, "--only", "b_only", "-k", "2", "--json"])
    assert old.exit_code == 0 and "-k/--k for the page's size is deprecated" in old.stderr
    assert len(json.loads(old.stdout)["rows"]) == 2
    both = CliRunner().invoke(app, ["search", "crosscoder", root, CC, "--limit", "3", "-k", "2"])
    assert both.exit_code == 2 and "give the page's size as --limit only" in both.output
    near = CliRunner().invoke(app, ["search", "crosscoder", root, CC, "--latent", "5", "--k", "1", "--json"])
    assert near.exit_code == 0, near.output
    assert len(json.loads(near.stdout)["nearest_a"]) == 1 and len(json.loads(near.stdout)["nearest_b"]) == 1
    table = CliRunner().invoke(app, ["search", "crosscoder", root, CC, "--only", "a_only"])
    assert table.exit_code == 0 and "4 a_only latents" in table.output and "nu_error" in table.output
    card = CliRunner().invoke(app, ["search", "crosscoder", root, CC, "--latent", "0"])
    assert card.exit_code == 0 and "nearest features, side A" in card.output
    bad = CliRunner().invoke(app, ["search", "crosscoder", root, CC, "--only", "c"])
    assert bad.exit_code == 2 and "latent_class: Input should be" in bad.output
    unknown = CliRunner().invoke(app, ["search", "crosscoder", root, "nope"])
    assert unknown.exit_code == 2 and f"stored crosscoders: {CC}" in unknown.output


def test_unknown_crosscoder_names_the_stored_ones(compared: dict[str, Any]) -> None:
    with pytest.raises(NotFoundError, match=f"stored crosscoders: {CC}"):
        Atlas(compared["root"]).crosscoder_latent("nope", 0)
