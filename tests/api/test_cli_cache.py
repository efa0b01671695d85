"""`sae-atlas cache` on shallow models and empty corpora: the default `--layers` spread names
only layers the model has, and a run refused for its corpus leaves no atlas behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sae_atlas.api.cli import app


@pytest.mark.parametrize(("n_layers", "hooks"), [
    (1, ["blocks.0.hook_resid_post"]),
    (2, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]),
])
def test_default_layers_fit_a_shallow_model(n_layers: int, hooks: list[str], tmp_path: Path) -> None:
    model = json.dumps({"kind": "tiny", "n_layers": n_layers, "d_model": 16, "n_heads": 2, "d_mlp": 32})
    result = CliRunner().invoke(app, ["cache", str(tmp_path / "atlas"), "--model", model,
                                      "--tokens", "64", "--context", "16", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["hooks"] == hooks


def test_empty_corpus_leaves_no_atlas(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    root = tmp_path / "atlas"
    result = CliRunner().invoke(app, ["cache", str(root), "--model", '{"kind": "tiny", "n_layers": 2}',
                                      "--corpus", str(empty), "--tokens", "64", "--context", "16", "--json"])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "empty or too short for one block" in lines[0]
    assert not root.exists()
