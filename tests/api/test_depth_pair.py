"""`analyze depth --model-b`: two models on the same texts. A "fine-tuned" copy of a tiny model
(block 2's MLP changed, saved as a Hugging Face folder) has CKA 1 with the base at the blocks
before it, and there its ID and local-ID shift is exactly 0 with p = 1; after it they move.
Across tokenizers the texts are paired by compare's character alignment; texts that never
align are a clear error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from sae_atlas.api.analyses.depth import run_depth_pair
from sae_atlas.api.cli import app
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.models import load_causal_lm, tiny_model
from tests.saes.test_compare_align import split_tokenizer

MODEL = {"kind": "tiny", "arch": "llama", "n_layers": 4, "seed": 3}
SMALL = ["--context", "32", "--tokens", "512", "--batch-blocks", "2", "--max-points", "200", "--k", "8",
         "--mle-k", "8", "--n-permutations", "200", "--device", "cpu"]
NEVER_ALIGN = r"\w+\s|[^\w\s]\s?|\w+"  # every token ends after its space: never where a word-level token ends


def hf_folder(folder: Path, tokenizer=None, change_block: int | None = None) -> str:
    """MODEL saved as a Hugging Face folder, with block `change_block`'s MLP redrawn and
    `tokenizer` instead of its own when given."""
    _, hf, own = load_causal_lm(MODEL)
    if change_block is not None:
        torch.manual_seed(1)
        mlp = hf.model.layers[change_block].mlp
        with torch.no_grad():
            for proj in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                proj.weight.mul_(4.0).add_(torch.randn_like(proj.weight))
    hf.save_pretrained(folder)
    (tokenizer or own).save_pretrained(folder)
    return str(folder)


def test_fine_tuned_copy_moves_only_from_its_changed_block(tmp_path: Path):
    tuned = hf_folder(tmp_path / "tuned", change_block=2)
    atlas = tmp_path / "atlas"
    out = CliRunner().invoke(app, ["analyze", "depth", str(atlas), "--model", json.dumps(MODEL),
                                   "--model-b", tuned, "--json", *SMALL])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert got["params"]["aligned_by"] == "shared token ids" and got["summary"]["layers_b"] == [0, 1, 2, 3]
    shift = {row["layer"]: row for row in got["shift"]}
    for layer in (0, 1):  # before the changed block: the same states
        assert shift[layer]["mle_shift"] == shift[layer]["lid_shift"] == 0.0
        assert shift[layer]["mle_shift_p"] == shift[layer]["lid_shift_p"] == 1.0
    for layer in (2, 3):
        assert shift[layer]["mle_shift"] != 0.0 and shift[layer]["mle_shift_p"] < 1.0
    assert 2 in got["summary"]["shift_layers_p_below_0_05"] or 3 in got["summary"]["shift_layers_p_below_0_05"]
    meta = json.loads(Path(got["json_path"]).read_text())
    assert set(meta["tables"]) == {"main", "shift"}
    import polars as pl

    cka = pl.read_parquet(atlas / "analyses" / "depth" / meta["tables"]["main"]["file"])
    M = cka.pivot(on="layer_b", index="layer_a", values="cka").drop("layer_a").to_numpy()
    assert M.shape == (4, 4) and np.allclose(np.diag(M)[:2], 1.0) and np.diag(M)[3] < 0.999
    assert got["summary"]["best_b_layer"]["0"] == 0


def test_two_tokenizers_pair_by_characters_and_never_aligned_texts_are_refused(tmp_path: Path):
    handle = tiny_model(**{k: v for k, v in MODEL.items() if k != "kind"})
    chars = dataclasses.replace(handle, tokenizer=split_tokenizer("."))  # one token per character
    corpus = tmp_path / "spaced.jsonl"  # every word followed by a space; documents shorter than a block
    words = "the a cat dog bird fish horse cow sat ran mat house tree car red blue green big small".split()
    rng = np.random.default_rng(0)
    corpus.write_text("".join(json.dumps({"text": "".join(w + " " for w in rng.choice(words, 12))}) + "\n"
                              for _ in range(60)))
    out = run_depth_pair(tmp_path / "atlas", handle, chars, CorpusSpec(source=str(corpus), context_size=32),
                         [1, 2, 3], n_tokens=300, max_points=150, k=5, mle_k=5, n_boot=20, n_permutations=50,
                         progress=False)
    assert out["params"]["aligned_by"].startswith("character spans") and out["summary"]["n_tokens"] > 100
    assert out["tables"]["main"].height == 9 and "shift" in out["tables"]

    words = dataclasses.replace(handle, tokenizer=split_tokenizer(NEVER_ALIGN))
    with pytest.raises(InvalidInputError, match="do not align across the two tokenizers"):
        run_depth_pair(tmp_path / "atlas", handle, words, CorpusSpec(source=str(corpus), context_size=32), [1, 2, 3],
                       n_tokens=400, progress=False)
    folder = hf_folder(tmp_path / "words", tokenizer=split_tokenizer(NEVER_ALIGN))  # the same, from the command line
    cli = CliRunner().invoke(app, ["analyze", "depth", str(tmp_path / "atlas"), "--model", json.dumps(MODEL),
                                   "--model-b", folder, "--corpus", str(corpus), "--layers", "1-3", *SMALL])
    assert cli.exit_code == 2 and "do not align across the two tokenizers" in cli.output, cli.output
