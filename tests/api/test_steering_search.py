"""`Atlas.steering_features`, `Atlas.steer_bench` and their CLI verbs over the small atlas:
an SAE without steering scores or without summaries is named with the command to run; a
search returns ranked features whose ready edit `Atlas.steer` accepts; the verbs print
tables and JSON, write the bench's results file and plot, and refuse bad targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.saes.intervene.output_scores import SteeringParams, compute_steering_scores
from sae_atlas.saes.models import tiny_model
from tests.saes.planted import one_thread  # noqa: F401

SMALL = {"k": 2, "n_prompts": 4, "candidates": 4}


@pytest.fixture(scope="module")
def scored(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the small atlas with steering scores for its first SAE only."""
    root = tmp_path_factory.mktemp("steering-search") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    compute_steering_scores(tiny_model(n_layers=2, d_model=32), root, small_atlas["sae_ids"][0],
                            SteeringParams(n_prompts=4, prompt_tokens=8, chunk=64), progress=False)
    return {**small_atlas, "root": root}


def test_a_search_ranks_features_with_a_ready_edit(scored: dict[str, Any]) -> None:
    atlas = Atlas(scored["root"])
    sae_id = scored["sae_ids"][0]
    with pytest.raises(NotFoundError, match=f"sae-atlas steering-scores {scored['root']} --sae"):
        atlas.steering_features("cat", **SMALL)  # the second SAE has no steering table
    result = atlas.steering_features("cat", saes=[sae_id], **SMALL)
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["tokens"] == ["cat"] and payload["target_kind"] == "tokens" and len(payload["features"]) == 2
    top = payload["features"][0]
    assert top["rank"] == 1 and top["sae_id"] == sae_id and top["edit"]["kind"] == "steer"
    assert top["edit"]["alpha"] == pytest.approx(top["strength"]["alpha"]) and top["edit"]["at"] == "last"
    assert set(top["strength"]) == {"alpha", "act_multiple", "norm_fraction"} and "label" in top
    assert payload["seed"] == 1  # one past the steering table's seed
    assert payload["features"][0]["best_ratio"] >= payload["features"][1]["best_ratio"]
    steered = atlas.steer("the cat sat on the", [result.best_edit], max_new_tokens=2)
    assert steered.edits[0]["feature"] == top["latent"]
    clamped = atlas.steering_features("cat", saes=[sae_id], mode="clamp", **SMALL)
    assert clamped.features[0]["edit"]["kind"] == "clamp" and "value" in clamped.features[0]["edit"]
    with pytest.raises(InvalidInputError, match="ratio"):
        atlas.steering_features("cat", saes=[sae_id], ratio=1.0, **SMALL)


def test_an_sae_without_summaries_is_named(scored: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(scored["root"], root)
    folder = root / "saes" / scored["sae_ids"][0]
    for name in ("tables.json", "features.parquet", "examples.parquet", "occurrence.npz"):
        (folder / name).unlink()
    with pytest.raises(NotFoundError, match="sae-atlas summarize"):
        Atlas(root).steering_features("cat", saes=[scored["sae_ids"][0]], **SMALL)


def test_the_verbs_print_tables_json_and_files(scored: dict[str, Any], tmp_path: Path) -> None:
    root, sae_id = str(scored["root"]), scored["sae_ids"][0]
    common = ["--sae", sae_id, "--n-prompts", "4", "--candidates", "4"]
    result = CliRunner().invoke(app, ["steering-search", root, "cat", *common, "-k", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["features"][0]["edit"]["sae"] == sae_id
    table = CliRunner().invoke(app, ["steering-search", root, "--concept", "weekdays", *common, "-k", "1"])
    assert table.exit_code == 0 and "ready edit" in table.output, table.output
    for args, message in [(["zebra"], "not in the model's vocabulary"), ([], "exactly one target"),
                          (["cat", "--concept", "months"], "exactly one target"),
                          (["--contrast-a", str(tmp_path / "missing.txt")], "both --contrast-a")]:
        bad = CliRunner().invoke(app, ["steering-search", root, *args, *common])
        assert bad.exit_code == 2 and message in bad.output, bad.output
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    bench = CliRunner().invoke(app, ["steer-bench", root, "cat", *common, "--ratio", "1.5", "--out", str(out),
                                     "--plot", str(plot)])
    assert bench.exit_code == 0, bench.output
    arms = json.loads(out.read_text())["arms"]
    assert [a["arm"] for a in arms] == ["top_result", "feature_add", "feature_clamp", "combination", "top_activating",
                                        "diff_means", "probe", "random_feature", "prompting"]
    assert plot.read_bytes()[:4] == b"\x89PNG" and "steer-bench" in bench.output
    assert "share of (target, prompt) pairs" in bench.output and "arms reaching" in bench.output
    assert "the top result of steering-search" in bench.output
    shares = json.loads(out.read_text())["shares"]
    assert {(s["arm"], s["style"]) for s in shares} >= {("feature_add", "all"), ("prompting", "neutral")}
    # the user's own prompts: half rank, half confirm; a file without any is named
    mine, blank = tmp_path / "mine.txt", tmp_path / "blank.txt"
    mine.write_text("the cat sat on the\na dog ran to the\nthe cow sat on a\na cat ran to a\n")
    blank.write_text("\n  \n")
    user = CliRunner().invoke(app, ["steering-search", root, "cat", *common, "-k", "1", "--style", "user", "--style",
                                    "neutral", "--prompts-file", str(mine), "--json"])
    assert user.exit_code == 0, user.output
    found = json.loads(user.output)
    assert found["prompt_counts"]["confirm"] == {"neutral": 16, "user": 2}
    assert set(found["features"][0]["confirmed_styles"]) == {"neutral", "user"}
    assert found["features"][0]["density"] is not None and found["density_floor"] > 0
    # the deprecated `--atlas` still names the atlas (the first argument is then a token), with a warning
    bad = CliRunner().invoke(app, ["steering-search", "cat", "--atlas", root, *common, "--prompts-file", str(blank)])
    assert bad.exit_code == 2 and "no usable prompts" in bad.output, bad.output
    assert "--atlas is deprecated" in bad.output
