"""Labels appear wherever feature numbers do: a feature page's similar and cross-layer
features (Python, HTTP, the explorer read these) and the CLI's `feature` card."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from api.atlas import Atlas
from api.cli import app


def test_feature_neighbours_carry_their_labels(small_atlas: dict[str, Any]) -> None:
    atlas = Atlas(small_atlas["root"])
    sae, other = small_atlas["sae_ids"]
    feature = atlas.feature(sae, 3, neighbours=4)
    assert feature.neighbours and feature.cross_layer
    for rows, frame in ((feature.neighbours, atlas.similar(sae, 3, k=4)), (feature.cross_layer, None)):
        assert all(isinstance(r["label"], str) and r["label"] for r in rows)
        if frame is not None:  # the same latents, in the same order, as the similar search
            assert [(r["latent"], r["label"]) for r in rows] == list(zip(frame["latent"], frame["label"], strict=True))
    assert {r["sae_id"] for r in feature.cross_layer} == {other}


def test_cli_feature_prints_the_label(small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][0]
    label = Atlas(small_atlas["root"]).feature(sae, 3).label
    out = CliRunner().invoke(app, ["feature", str(small_atlas["root"]), sae, "3"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert label and f"label: {label}" in out.output


def test_cli_text_search_prints_labels_and_leaves_bos_out(small_atlas: dict[str, Any]) -> None:
    sae = small_atlas["sae_ids"][1]
    found = Atlas(small_atlas["root"]).search_text("the cat sat", sae_ids=[sae], k=2)
    out = CliRunner().invoke(app, ["search", "text", str(small_atlas["root"]), "the cat sat", "--sae-id", sae, "-k", "2"],
                             env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "<s>" not in out.output and found.features[sae][0][0]["label"] in out.output
    shown = CliRunner().invoke(app, ["search", "text", str(small_atlas["root"]), "the cat sat", "--sae-id", sae,
                                     "--include-special", "--json"])
    assert shown.exit_code == 0 and '"<s>"' in shown.output
