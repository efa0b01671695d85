"""`sae-atlas compare`, `Atlas.compare` and `GET /compare` on a tiny atlas: an SAE against a
permuted copy of itself streamed through the model scores MCC 1, the run is stored and
verified, and bad input gets a clear error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from starlette.testclient import TestClient
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.api.http import ServerSettings, create_app
from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.compare.pairs import Side, paired_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats.saelens import save_saelens
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.layout import AtlasLayout
from tests.saes.compare_fixtures import one_thread  # noqa: F401
from tests.saes.test_compare_align import split_tokenizer

MODEL = {"kind": "tiny", "n_layers": 2, "d_model": 32}
HOOK = "blocks.1.hook_resid_post"
PERM = np.random.default_rng(0).permutation(48)


def _sae(seed: int, hook: str):
    torch.manual_seed(seed)
    sae = build_sae(SAEConfig(architecture="topk", d_in=32, d_sae=48, k=4, hook_name=hook)).eval()
    with torch.no_grad():
        sae.W_dec.copy_(torch.nn.functional.normalize(torch.randn(48, 32), dim=1))
        sae.W_enc.copy_(sae.W_dec.T)
        sae.b_dec.zero_()
        sae.b_enc.zero_()
    return sae


@pytest.fixture(scope="module")
def atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An atlas with an SAE, its permuted copy (same hook) and an SAE of the other layer."""
    root = tmp_path_factory.mktemp("compare") / "atlas"
    AtlasLayout(root).update_meta(model=MODEL)
    sae = _sae(0, HOOK)
    copy = build_sae(sae.cfg).eval()
    with torch.no_grad():
        copy.W_enc.copy_(sae.W_enc[:, PERM])
        copy.b_enc.copy_(sae.b_enc[PERM])
        copy.W_dec.copy_(sae.W_dec[PERM])
        copy.b_dec.copy_(sae.b_dec)
    for sae_id, s in (("orig", sae), ("perm", copy), ("layer0", _sae(1, "blocks.0.hook_resid_post"))):
        save_saelens(s, AtlasLayout(root).sae_dir(sae_id))
    return root


OPTIONS = {"n_tokens": 2048, "sample_tokens": 256, "n_perm": 10, "corpus": CorpusSpec(context_size=32)}


@pytest.fixture(scope="module")
def stored(atlas: Path):
    return Atlas(atlas).compare(atlas, sae="orig", other_sae="perm", run="orig-perm", **OPTIONS)


def test_a_permuted_copy_streamed_through_the_model_matches_one_to_one(stored):
    pairs = stored.pairs.frame
    alive = pairs.filter(pairs["corr"] > 0.5)
    assert alive.height >= 36 and alive.height == 48 - stored.summary["n_rare_a"]  # latents that fired 10+ times
    assert (PERM[alive["b_latent"].to_numpy()] == alive["a_latent"].to_numpy()).all()
    assert np.allclose(alive["corr"].to_numpy(), 1.0, atol=1e-5) and alive["mutual"].all()
    s = stored.summary
    assert s["decoder_mcc"] == pytest.approx(1.0) and s["decoder_mcc_null"]["null_mean"] < 0.6
    assert s["mcc"] > s["mcc_null"]["null_mean"] + 0.3
    assert s["spaces"]["decoder_svcca_random_features"]["score"] == pytest.approx(1.0)
    assert 0.9 * 2048 < s["n_tokens"] <= 2048 - 2048 // 32  # BOS and separator positions left out


def test_the_run_is_stored_verified_and_served(atlas: Path, stored):
    a = Atlas(atlas)
    assert [r["run"] for r in a.comparisons()] == ["orig-perm"]
    assert a.comparison("orig-perm").summary == stored.summary
    with TestClient(create_app(ServerSettings(root=atlas))) as http:
        listing = http.get("/compare").json()
        assert listing[0]["run"] == "orig-perm" and listing[0]["decoder_mcc"] == pytest.approx(1.0)
        one = http.get("/compare/orig-perm", params={"pairs": 3}).json()
        assert len(one["pairs"]) == 3 and one["parameters"]["sae_b"] == "perm"
        assert {r["space"] for r in one["spaces"]} == {"decoder", "activation"}
        assert http.get("/compare/nope").status_code == 404
    (atlas / "analyses" / "compare" / "orig-perm.spaces.parquet").write_bytes(b"broken")
    with pytest.raises(IntegrityError, match="orig-perm.spaces.parquet"):
        a.comparison("orig-perm")


def test_cli_compares_two_layers_with_json_and_groups(atlas: Path):
    lobes = pl.DataFrame({"latent": np.arange(48, dtype=np.int32), "lobe": np.arange(48) % 3})
    write_analysis(atlas, "lobes", "planted", parameters={}, tables={"main": lobes})
    out = CliRunner().invoke(app, ["compare", f"{atlas}:orig", f"{atlas}:layer0", "--tokens", "1024", "--context",
                                   "32", "--n-perm", "5", "--sample-tokens", "128", "--groups", "lobes/planted", "--min-fires", "0",
                                   "--json", "--top", "2"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["run"] == "orig--layer0" and len(body["pairs"]) == 2
    assert body["summary"]["mcc_null"]["n_null"] == 1
    assert [g["group"] for g in body["groups"]] == ["lobe=0", "lobe=1", "lobe=2"]
    assert all(g["n_latents"] == 16 and g["n_pairs"] == 16 and 0 < g["decoder_svcca_random_features_p"] <= 1
               for g in body["groups"])


def test_bad_input_is_refused_with_a_clear_message(atlas: Path):
    bad = CliRunner().invoke(app, ["compare", str(atlas), f"{atlas}:orig"])
    assert bad.exit_code == 2 and "has 3 SAEs" in bad.output
    same = CliRunner().invoke(app, ["compare", f"{atlas}:orig", f"{atlas}:orig"])
    assert same.exit_code == 2 and "two different SAEs" in same.output
    with pytest.raises(InvalidInputError, match="shared d_model"):
        from sae_atlas.saes.compare.saes_pair import decoder_match

        decoder_match(np.ones((4, 32)), np.ones((4, 16)))


def test_texts_that_never_align_across_tokenizers_are_refused(tmp_path: Path):
    handle = tiny_model(n_layers=1, d_model=32)
    other = dataclasses.replace(handle, tokenizer=split_tokenizer(r"\w+\s|[^\w\s]\s?|\w+"))
    corpus = tmp_path / "spaced.txt"
    corpus.write_text("the cat sat on the mat ")
    pairs = paired_activations(Side(handle, "blocks.0.hook_resid_post"), Side(other, "blocks.0.hook_resid_post"),
                               CorpusSpec(source=str(corpus)), n_tokens=100)
    with pytest.raises(InvalidInputError, match="do not align across the two tokenizers"):
        list(pairs)
