"""Caching and `eval --from-model` under torchrun (2 gloo ranks on CPU): the ranks write the
same shards as one process (shard k by rank k mod R), a rank killed with kill -9 resumes
to identical shards, writers of different rank counts resume each other's shards, a
re-run recomputes a corrupt shard of a finished cache, and the ranks' merged eval metrics
equal one process's."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_atlas.errors import IntegrityError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.eval.from_model import evaluate_from_model
from sae_atlas.saes.models import load_model
from sae_atlas.saes.train.reconstruction import ReconstructionStats
from sae_atlas.store.activations import ActivationReader, ActivationWriter
from tests.saes.planted import one_thread  # noqa: F401
from tests.saes.stream_fixture import BATCH_BLOCKS, CORPUS, N_TOKENS, SAES, make_atlas

REPO = Path(__file__).resolve().parents[2]
TINY = {"kind": "tiny", "n_layers": 3, "d_model": 32, "seed": 7}
HOOKS = ["blocks.0.hook_resid_post", "blocks.2.hook_resid_post"]
CONTEXT, BATCH, SHARD = 16, 2, 4
TOKENS = CONTEXT * 74  # 74 blocks: 18 full shards of 4 and a last one of 2 (rank 0's)
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def cache_args(atlas: Path) -> list[str]:
    return ["cache", str(atlas), "--model", json.dumps(TINY), *(a for h in HOOKS for a in ("--hook", h)),
            "--tokens", str(TOKENS), "--context", str(CONTEXT), "--batch-blocks", str(BATCH),
            "--shard-blocks", str(SHARD), "--dtype", "float16", "--device", "cpu", "--json"]


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)


def shards(atlas: Path) -> dict[str, list[dict[str, object]]]:
    out = {}
    for hook in HOOKS:
        manifest = json.loads((atlas / "activations" / hook / "manifest.json").read_text())
        assert manifest["complete"]
        out[hook] = [{k: s[k] for k in ("file", "first_block", "n_blocks", "sha256")} for s in manifest["shards"]]
    return out


def files(atlas: Path) -> dict[str, list[str]]:
    return {hook: sorted(p.name for p in (atlas / "activations" / hook).iterdir()) for hook in HOOKS}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache of one process (the library call the CLI makes)."""
    root = tmp_path_factory.mktemp("solo")
    cache_activations(load_model(TINY, device="cpu", dtype="float32"), root, HOOKS,
                      corpus=CorpusSpec(context_size=CONTEXT), n_tokens=TOKENS, dtype="float16",
                      batch_blocks=BATCH, shard_blocks=SHARD, progress=False)
    return root


def test_two_ranks_write_the_shards_of_one_process_and_resume_a_killed_rank(tmp_path: Path, reference: Path) -> None:
    # the real command, with rank 1 sending itself SIGKILL before its 8th forward
    killed = torchrun("-m", "tests.saes.cache_worker", "8", *cache_args(tmp_path))
    assert killed.returncode != 0
    folder = tmp_path / "activations" / HOOKS[1]
    assert not (folder / "manifest.json").exists(), "the run finished before rank 1 was killed"
    record = json.loads((folder / "manifest-rank-0001-of-0002.json").read_text())
    assert [s["file"] for s in record["shards"]] == ["shard-00001.safetensors", "shard-00003.safetensors",
                                                     "shard-00005.safetensors"]
    resumed = torchrun("-m", "sae_atlas", *cache_args(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout)  # printed once, by rank 0
    assert summary["n_blocks"] == 74 and summary["n_shards"] == 2 * 19 and summary["resumed_from_blocks"] >= 12
    assert shards(tmp_path) == shards(reference)
    assert files(tmp_path) == files(reference)  # no rank records or temporaries left
    for hook in HOOKS:
        ours, theirs = ActivationReader(tmp_path, hook), ActivationReader(reference, hook)
        ours.verify()
        for a, b in zip(ours.blocks(), theirs.blocks(), strict=True):
            assert torch.equal(a.acts, b.acts) and torch.equal(a.token_ids, b.token_ids)
            assert torch.equal(a.block_index, b.block_index)


def test_writers_of_any_rank_count_resume_each_other(tmp_path: Path) -> None:
    acts_NTD = torch.randn(10, 4, 8)
    toks_NT = torch.randint(3, 50, (10, 4))

    def writer(rank: int, world: int) -> ActivationWriter:
        return ActivationWriter(tmp_path, HOOKS[0], d=8, context_size=4, shard_blocks=2, model="m",
                                rank=rank, world_size=world, total_blocks=10)

    def write(w: ActivationWriter, shard_numbers: list[int]) -> None:
        for k in shard_numbers:
            w.append(acts_NTD[2 * k : 2 * k + 2], toks_NT[2 * k : 2 * k + 2], torch.arange(2 * k, 2 * k + 2))

    three = [writer(r, 3) for r in range(3)]
    write(three[0], [0, 3])
    write(three[1], [1])  # killed before shard 4
    (tmp_path / "activations" / HOOKS[0] / ".shard-00004.safetensors.x.tmp").write_bytes(b"partial")
    two = [writer(r, 2) for r in range(2)]  # resumed with 2 ranks: 0 owns 0, 2, 4; 1 owns 1, 3
    assert [w.n_blocks_done for w in two] == [2, 4]
    assert (tmp_path / "activations" / HOOKS[0] / "shard-00003.safetensors").exists()
    assert not (tmp_path / "activations" / HOOKS[0] / ".shard-00004.safetensors.x.tmp").exists()
    write(two[0], [2, 4])
    two[0].finish()
    with pytest.raises(IntegrityError, match="rank 1 left no record"):
        two[0].merge_ranks()  # before rank 1 finished
    two[1].finish()
    two[0].merge_ranks()
    reader = ActivationReader(tmp_path, HOOKS[0])
    reader.verify()
    assert torch.equal(torch.cat([b.acts for b in reader.blocks()]), acts_NTD)
    assert not list((tmp_path / "activations" / HOOKS[0]).glob("manifest-rank-*"))


def test_two_rank_eval_from_model_equals_one_process(tmp_path: Path) -> None:
    handle = make_atlas(tmp_path, with_cache=False)
    solo = evaluate_from_model(handle, tmp_path, list(SAES), corpus=CORPUS, n_tokens=N_TOKENS,
                               batch_blocks=BATCH_BLOCKS)
    for sae_id in SAES:
        (tmp_path / "saes" / sae_id / "eval.json").unlink()
    proc = torchrun("-m", "sae_atlas", "eval", str(tmp_path), "--from-model", "--tokens", str(N_TOKENS),
                    "--context", str(CORPUS.context_size), "--batch-blocks", str(BATCH_BLOCKS), "--device", "cpu",
                    "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)  # printed once, by rank 0
    for sae_id in SAES:
        saved = json.loads((tmp_path / "saes" / sae_id / "eval.json").read_text())
        assert saved["metrics"] == printed[sae_id]["metrics"]
        ranks, one = saved["metrics"], solo[sae_id]["metrics"]
        assert ranks["n_tokens"] == one["n_tokens"] == 396
        assert 0 < ranks["l0"] <= 4 and ranks["explained_variance"] is not None
        for key, value in one.items():
            if isinstance(value, float):
                assert math.isclose(ranks[key], value, rel_tol=1e-9, abs_tol=1e-12), key
            else:
                assert ranks[key] == value, key


def test_merged_reconstruction_stats_equal_one_accumulation() -> None:
    gen = torch.Generator().manual_seed(4)
    x = 1000.0 + torch.randn(400, 6, generator=gen) * torch.linspace(0.5, 3.0, 6)  # a large mean: shifts matter
    x_hat = x + 0.3 * torch.randn(400, 6, generator=gen)
    f = (torch.rand(400, 9, generator=gen) > 0.8).float()
    whole, first, second, empty = (ReconstructionStats(6, 9) for _ in range(4))
    whole.update(x, x_hat, f)
    first.update(x[:150], x_hat[:150], f[:150])
    second.update(x[150:] + 0.0, x_hat[150:], f[150:])
    merged = empty.merge_(first).merge_(ReconstructionStats(6, 9)).merge_(second).result()
    one = whole.result()
    assert merged["n_tokens"] == 400 and merged["density_histogram"] == one["density_histogram"]
    assert 0.9 < one["explained_variance"] < 1
    for key in ("explained_variance", "fvu", "mse", "cossim", "l0", "l1", "relative_reconstruction_bias"):
        assert merged[key] == pytest.approx(one[key], rel=1e-9), key


def test_rerun_repairs_a_corrupt_shard_of_a_finished_cache(tmp_path: Path, reference: Path) -> None:
    shutil.copytree(reference, tmp_path / "atlas")
    damaged = tmp_path / "atlas" / "activations" / HOOKS[0] / "shard-00002.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF
    damaged.write_bytes(bytes(data))
    untouched = (tmp_path / "atlas" / "activations" / HOOKS[1] / "shard-00002.safetensors").stat().st_mtime_ns
    summary = cache_activations(load_model(TINY, device="cpu", dtype="float32"), tmp_path / "atlas", HOOKS,
                                corpus=CorpusSpec(context_size=CONTEXT), n_tokens=TOKENS, dtype="float16",
                                batch_blocks=BATCH, shard_blocks=SHARD, progress=False)
    assert not summary.already_complete and summary.resumed_from_blocks == 8  # shards 0 and 1 kept
    assert shards(tmp_path / "atlas") == shards(reference)
    assert (tmp_path / "atlas" / "activations" / HOOKS[1] / "shard-00002.safetensors").stat().st_mtime_ns == untouched


def test_two_rank_eval_suite_equals_one_process(tmp_path: Path) -> None:
    solo_root, ranks_root = tmp_path / "solo", tmp_path / "ranks"
    for root in (solo_root, ranks_root):
        make_atlas(root)
    args = ["eval", "--suite", "core,mdl", "--tokens", "200", "--no-model", "--device", "cpu", "--json"]
    solo = subprocess.run([sys.executable, "-m", "sae_atlas", args[0], str(solo_root), *args[1:]], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert solo.returncode == 0, solo.stderr[-3000:]
    proc = torchrun("-m", "sae_atlas", args[0], str(ranks_root), *args[1:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = json.loads(solo.stdout), json.loads(proc.stdout)  # printed once, by rank 0
    assert set(two) == set(SAES) and all(set(two[s]) == {"core", "mdl"} for s in SAES)
    for sae_id in SAES:
        for name in ("core", "mdl"):
            stored = json.loads((ranks_root / "saes" / sae_id / "evals" / f"{name}.json").read_text())
            assert stored["eval_result_metrics"] == two[sae_id][name]["eval_result_metrics"]
            assert two[sae_id][name]["eval_result_metrics"] == one[sae_id][name]["eval_result_metrics"]
