"""Activation caching: equals a direct run_with_cache, resumes after SIGKILL byte for byte."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.models import tiny_model
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.layout import AtlasLayout

REPO = Path(__file__).resolve().parents[2]
TINY = {"kind": "tiny", "n_layers": 3, "d_model": 32, "seed": 7}


@pytest.fixture(scope="module")
def handle():
    return tiny_model(**{k: v for k, v in TINY.items() if k != "kind"})


def test_cached_activations_equal_run_with_cache(tmp_path, handle):
    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"]
    summary = cache_activations(handle, tmp_path, hooks, corpus=CorpusSpec(context_size=16),
                                n_tokens=16 * 12, batch_blocks=4, shard_blocks=4, progress=False)
    assert summary.n_blocks == 12 and summary.n_tokens == 192 and summary.n_shards == 9
    meta = AtlasLayout(tmp_path).read_meta()
    assert meta["model"] == handle.spec and meta["hooks"] == sorted(hooks)
    readers = {h: ActivationReader(tmp_path, h) for h in hooks}
    first = next(readers[hooks[0]].blocks())
    _, cache = handle.bridge.run_with_cache(first.token_ids)
    for hook, reader in readers.items():
        blocks = next(reader.blocks())
        assert torch.equal(blocks.token_ids, first.token_ids)
        assert (blocks.acts - cache[hook]).abs().max() < 1e-6
    again = cache_activations(handle, tmp_path, hooks, corpus=CorpusSpec(context_size=16),
                              n_tokens=16 * 12, batch_blocks=4, shard_blocks=4, progress=False)
    assert again.already_complete


def test_bad_requests_are_clear(tmp_path, handle):
    corpus = CorpusSpec(context_size=16)
    with pytest.raises(UnknownHookError, match="blocks.9.hook_resid_post"):
        cache_activations(handle, tmp_path, ["blocks.9.hook_resid_post"], corpus=corpus, n_tokens=64)
    with pytest.raises(InvalidInputError, match="unknown activation dtype"):
        cache_activations(handle, tmp_path, ["blocks.0.hook_resid_post"], corpus=corpus, n_tokens=64, dtype="fp8")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(InvalidInputError, match="empty or too short"):
        cache_activations(handle, tmp_path / "a", ["blocks.0.hook_resid_post"],
                          corpus=CorpusSpec(source=str(empty), context_size=16), n_tokens=64, progress=False)


def _cache_cmd(atlas: Path, tokens: int) -> list[str]:
    return [sys.executable, "-m", "sae_atlas", "cache", str(atlas), "--model", json.dumps(TINY),
            "--hook", "blocks.0.hook_resid_post", "--hook", "blocks.2.hook_resid_post",
            "--tokens", str(tokens), "--context", "32", "--batch-blocks", "4", "--shard-blocks", "4",
            "--dtype", "float16", "--json"]


def _shard_hashes(atlas: Path) -> dict[str, list[str]]:
    out = {}
    for hook in ("blocks.0.hook_resid_post", "blocks.2.hook_resid_post"):
        manifest = json.loads((atlas / "activations" / hook / "manifest.json").read_text())
        assert manifest["complete"]
        out[hook] = [s["sha256"] for s in manifest["shards"]]
    return out


def test_sigkill_mid_run_resumes_to_identical_shards(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    tokens = 32 * 1200
    reference = tmp_path / "reference"
    subprocess.run(_cache_cmd(reference, tokens), check=True, env=env, capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cache_cmd(killed, tokens), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    manifest = killed / "activations" / "blocks.2.hook_resid_post" / "manifest.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if len(json.loads(manifest.read_text())["shards"]) >= 5:
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads(manifest.read_text())
    assert not state["complete"], "the run finished before it could be killed"
    resumed = subprocess.run(_cache_cmd(killed, tokens), check=True, env=env, capture_output=True, text=True)
    assert json.loads(resumed.stdout)["resumed_from_blocks"] > 0
    assert _shard_hashes(killed) == _shard_hashes(reference)
    files = sorted(p.name for p in (killed / "activations" / "blocks.0.hook_resid_post").iterdir())
    assert files == sorted(p.name for p in (reference / "activations" / "blocks.0.hook_resid_post").iterdir())
