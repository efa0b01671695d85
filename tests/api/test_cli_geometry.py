"""`sae-atlas analyze galaxy|map|probe|lobes|crystals|hierarchy` on a copy of the small
atlas: each verb runs end to end, prints parseable `--json`, and leaves its result files
where the Atlas facade finds them; bad arguments are clear errors (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from sae_atlas import Atlas
from sae_atlas.api.cli import app


@pytest.fixture
def atlas_copy(small_atlas: dict[str, Any], tmp_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "atlas"
    shutil.copytree(small_atlas["root"], root)
    return root, small_atlas["sae_ids"]


def run(*args: str) -> Any:
    result = CliRunner().invoke(app, ["analyze", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_geometry_verbs_write_results_the_atlas_serves(atlas_copy: tuple[Path, list[str]]) -> None:
    root, sae_ids = atlas_copy
    galaxy = run("galaxy", str(root))
    assert [row["sae_id"] for row in galaxy["table"]] == sorted(sae_ids)
    assert all(row["alpha"] > 0 and row["twonn_dimension"] > 1 for row in galaxy["table"])

    maps = run("map", str(root), "--sae", sae_ids[0])
    summary = maps[sae_ids[0]]["summary"]
    assert summary["n_features"] == 64 and summary["knn_overlap_mean"] > summary["chance"]
    cooc = summary["cooccurrence"]  # the summarized SAE gets its co-occurrence map too
    assert cooc["knn_overlap_mean"] > cooc["chance"] and "other_basis_overlap_mean" in cooc
    frame = pl.read_parquet(maps[sae_ids[0]]["path"])
    assert frame["latent"].to_list() == list(range(64)) and {"x", "y"} <= set(frame.columns)

    probe = run("probe", str(root), "--hooks", "blocks.0.hook_resid_post,blocks.1.hook_resid_post")
    layers = next(iter(probe["tables"].values()))
    assert len(layers) == 2 and all(row["test_score"] > row["baseline"] for row in layers)

    lobes = run("lobes", str(root), "--sae", sae_ids[0], "--n-clusters", "4")
    assert 0.0 <= lobes["comparison"]["p_value"] <= 1.0 and Path(lobes["json_path"]).exists()

    crystals = run("crystals", str(root), "--n-null", "5")
    assert crystals["summary"]["n_relations"] > 0

    hierarchy = run("hierarchy", str(root))  # the tiny model's vocabulary keeps two concepts
    assert hierarchy["params"]["n_concepts"] == 2 and hierarchy["summary"]["n_edges"] == 1
    assert Path(hierarchy["json_path"]).exists()

    atlas = Atlas(root)
    kinds = set(atlas.analyses()["kind"].to_list())
    assert {"galaxy", "probe", "lobes", "crystals", "hierarchy"} <= kinds
    assert len(atlas.map(sae_ids[0])) == len(atlas.map(sae_ids[0], "cooccurrence")) == 64


def test_geometry_verbs_refuse_bad_arguments(atlas_copy: tuple[Path, list[str]]) -> None:
    root, _ = atlas_copy
    cases = [
        (["lobes", str(root), "--sae", "no-such-sae"], "no-such-sae"),
        (["probe", str(root), "--hooks", "blocks.7.hook_resid_post"], "blocks.7.hook_resid_post"),
        (["hierarchy", str(root), "--min-tokens", "2"], "distinct token ids"),  # tiny vocabulary
        (["probe", str(root), "--hooks", "blocks.0.hook_resid_post", "--target", "nonsense"],
         "unknown concept 'nonsense'"),
    ]
    for args, needle in cases:
        result = CliRunner().invoke(app, ["analyze", *args])
        assert result.exit_code == 2 and needle in result.output, (args, result.output)
