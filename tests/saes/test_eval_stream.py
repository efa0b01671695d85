"""`eval --from-model`: activation metrics from streamed forwards equal those over a cache
of the same tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from sae_atlas.api.cli import app
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.eval.evaluate import evaluate_sae
from sae_atlas.saes.eval.from_model import evaluate_from_model
from sae_atlas.store.activations import ActivationReader
from tests.saes.stream_fixture import BATCH_BLOCKS, CORPUS, N_TOKENS, SAES, make_atlas


def test_streamed_eval_equals_cached_rows(tmp_path: Path) -> None:
    handle = make_atlas(tmp_path)
    records = evaluate_from_model(handle, tmp_path, list(SAES), corpus=CORPUS, n_tokens=N_TOKENS,
                                  batch_blocks=BATCH_BLOCKS)
    for sae_id, hook in SAES.items():
        rows = (r.acts for r in ActivationReader(tmp_path, hook).rows("all"))
        cached = evaluate_sae(load_atlas_sae(tmp_path, sae_id), rows, n_tokens=10**9)
        streamed = records[sae_id]["metrics"]
        assert streamed["n_tokens"] == cached["n_tokens"] == 396
        for key in ("explained_variance", "fvu", "l0", "cossim", "dead_fraction"):
            assert math.isclose(streamed[key], cached[key], rel_tol=1e-6, abs_tol=1e-9), key
        assert 0 < streamed["l0"] <= 4
    saved = json.loads((tmp_path / "saes" / "s0" / "eval.json").read_text())
    assert saved["parameters"]["split"] == "stream"


def test_cli_eval_from_model(tmp_path: Path) -> None:
    make_atlas(tmp_path, with_cache=False)
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--from-model", "--tokens", str(N_TOKENS),
                                      "--context", "16", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["s1"]["metrics"]["n_tokens"] == 396
