"""`sae-atlas train --from-model --model-b MODEL_B --crosscoder HOOK_A,HOOK_B` (and
`Atlas.train(from_model=True, model_b=...)`): a crosscoder of two models from the run's
stream, stored as `train-crosscoder --model-b` stores one, so the explorer's readers and
Latent Scaling take it unchanged; bad combinations are refused before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sae_atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.crosscoder import read_crosscoder_sides
from sae_atlas.saes.corpus import CorpusSpec

SPEC = {"kind": "tiny", "n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32}
SPEC_B = {**SPEC, "seed": 1}  # the same width (one space: Latent Scaling applies), other weights
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
SIZES = ["--d-sae", "32", "--k", "4", "--tokens", "320", "--batch-size", "32", "--context", "16",
         "--batch-blocks", "2", "--buffer-tokens", "128"]
CC_ID = f"{HOOKS[1]}--{HOOKS[1]}-32"


def _train(root: Path, *args: str) -> object:
    return CliRunner().invoke(app, ["train", str(root), "--from-model", "--model", json.dumps(SPEC), *SIZES,
                                    "--json", *args])


def test_a_crosscoder_of_two_models_is_stored_like_train_crosscoders_and_read_alike(tmp_path: Path) -> None:
    root = tmp_path / "a"
    result = _train(root, "--hook", HOOKS[0], "--crosscoder", f"{HOOKS[1]},{HOOKS[1]}", "--model-b",
                    json.dumps(SPEC_B))
    assert result.exit_code == 0, (result.output, result.exception)
    records = json.loads(result.output)
    assert set(records) == {HOOKS[0], CC_ID} and records[CC_ID]["kind"] == "crosscoder"
    sides = read_crosscoder_sides(root / "crosscoders" / CC_ID)["sides"]
    assert sides == {"model_a": "tiny-llama", "hook_a": HOOKS[1], "model_b": "tiny-llama", "hook_b": HOOKS[1],
                     "spec_b": SPEC_B}
    atlas = Atlas(root)
    (row,) = atlas.crosscoders()
    assert (row["crosscoder"], row["hook_a"], row["hook_b"], row["d_sae"]) == (CC_ID, HOOKS[1], HOOKS[1], 32)
    assert atlas.analysis("crosscoder", CC_ID).meta["parameters"]["spec_b"] == SPEC_B
    assert len(atlas.crosscoder_latents(CC_ID, limit=8).rows) == 8
    scaled = atlas.latent_scaling(CC_ID, tokens=256).table  # model B found again from its recorded spec
    assert "nu_error" in scaled.columns and (scaled["scaling_active_tokens"] > 0).any()


@pytest.mark.parametrize(("args", "needles"), [
    (["--hook", HOOKS[0], "--model-b", json.dumps(SPEC_B)], ("--model-b", "--crosscoder HOOK_A,HOOK_B")),
    (["--crosscoder", f"{HOOKS[0]},blocks.4.hook_resid_post", "--model-b", json.dumps(SPEC_B)],
     ("model B", "blocks.4.hook_resid_post")),
])
def test_a_bad_model_b_request_is_refused_before_training(tmp_path: Path, args: list[str],
                                                          needles: tuple[str, ...]) -> None:
    result = _train(tmp_path / "a", *args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert all(needle in result.output for needle in needles), result.output
    assert not (tmp_path / "a" / "crosscoders").exists() and not (tmp_path / "a" / "saes").exists()


def test_atlas_train_takes_model_b_as_the_cli_does(tmp_path: Path) -> None:
    atlas = Atlas.create(tmp_path / "a", model=SPEC)
    records = atlas.train(d_sae=32, k=4, tokens=320, batch_size=32, from_model=True, batch_blocks=2,
                          buffer_tokens=128, crosscoders=[(HOOKS[0], HOOKS[1])], model_b=SPEC_B,
                          corpus=CorpusSpec(context_size=16), progress=False)
    cc_id = f"{HOOKS[0]}--{HOOKS[1]}-32"
    assert records[cc_id]["kind"] == "crosscoder"
    assert read_crosscoder_sides(tmp_path / "a" / "crosscoders" / cc_id)["sides"]["spec_b"] == SPEC_B
    with pytest.raises(InvalidInputError, match="--model-b"):
        atlas.train([HOOKS[0]], model_b=SPEC_B)  # cached training has no side B
