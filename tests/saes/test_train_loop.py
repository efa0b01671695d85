"""One loop, many dictionaries of every kind, one batch source (`saes.train.loop`):
training them together gives exactly the weights of training each alone; a run killed
-9 at named points (mid-step, mid-checkpoint-write, while the first batches replay)
resumes to byte-identical weights; two torchrun ranks, data-parallel or module-sharded,
equal one process; impossible runs are refused before training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.crosscoder import train_crosscoder
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.train.checkpoint import save_checkpoint
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.loop import check_run, train_dictionaries
from sae_atlas.saes.train.sources import CachedSource
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.saes.train.trainer import SAEDictionary, train_sae
from sae_atlas.saes.transcoders.clt_train import train_clt
from sae_atlas.store.activations import ActivationReader
from tests.saes import loop_worker as w
from tests.saes.kill_points import KillPoint, fresh_copy, run_until_killed, timeless_tree
from tests.saes.planted import one_thread, write_planted_atlas  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def together() -> dict[str, dict[str, torch.Tensor]]:
    return w.train_all()


def test_dictionaries_trained_together_equal_each_trained_alone(together) -> None:
    rows = w.rows()
    a, b = [r[:, : w.D] for r in rows], [r[:, w.D:] for r in rows]
    alone = {
        "topk-1": train_sae(w.SAE_A, a, w.TRAIN).sae.state_dict(),
        "jumprelu-2": train_sae(w.SAE_B, b, w.TRAIN).sae.state_dict(),
        "topk-3": train_sae(w.TRANSCODER, rows, w.TRAIN).sae.state_dict(),
        f"crosscoder-{w.HOOK_A}-{w.HOOK_B}": train_crosscoder(lambda s: iter(rows[s:]), w.D, w.D, d_sae=48, k=4,
                                                              train_cfg=w.TRAIN)[0].sae.state_dict(),
        "clt-ln2.hook_normalized": train_clt(w.CLT, lambda s: iter([r.view(-1, 2, 1, w.D) for r in rows[s:]]),
                                             w.TRAIN).clt.state_dict(),
    }
    assert sorted(together) == sorted(alone)
    for name, state in alone.items():
        assert _equal(together[name], state), name  # byte-identical, not merely close


@pytest.mark.parametrize("point", [
    KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 11),  # step 3 (replaying the first batches)
    KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 4 * 9 + 2),  # step 9, two dictionaries stepped
    KillPoint("torch.save", 3, "mid_write"),  # half of the third checkpoint written
], ids=["mid-step-first-batches", "mid-step", "mid-checkpoint-write"])
def test_killed_run_resumes_to_identical_weights(point: KillPoint, together, tmp_path: Path) -> None:
    run_until_killed(lambda: w.train_all(tmp_path), point)
    assert list((tmp_path / "checkpoints").iterdir()), "killed before any checkpoint"
    resumed = w.train_all(tmp_path)
    for name, state in together.items():
        assert _equal(resumed[name], state), name


def _torchrun(tmp_path: Path, mode: str, *point: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.saes.loop_worker", str(tmp_path), mode, *point]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 or point, proc.stderr[-3000:]
    return proc


def test_two_ranks_module_sharded_killed_resume_to_the_weights_of_one_process(together, tmp_path: Path) -> None:
    """Both ranks die at step 7 (the first batches still replaying, checkpoint of step 6
    written by rank 0 from every rank's dictionaries); a second torchrun resumes."""
    point = KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 2 * 7 + 1)  # 2 SAE kinds per rank
    killed = _torchrun(tmp_path, "modules", json.dumps(point.__dict__))
    assert killed.returncode != 0 and f"exitcode  : -{signal.SIGKILL}" in killed.stderr, killed.stderr[-3000:]
    assert not list(tmp_path.glob("modules-*.pt"))
    assert sorted(p.name for p in (tmp_path / "run-modules" / "checkpoints").iterdir()) == ["step-00000004.pt",
                                                                                   "step-00000006.pt"]
    _torchrun(tmp_path, "modules")
    for name, state in together.items():
        assert _equal(torch.load(tmp_path / f"modules-{name}.pt"), state), name


def test_two_ranks_module_sharded_and_data_parallel_equal_one_process(together, tmp_path: Path) -> None:
    """Module-sharded: each rank trains its dictionaries on the all-gathered whole batches,
    bit for bit. Data-parallel: half-batch gradients averaged by DDP, equal up to float
    rounding (see saes.train.loop)."""
    _torchrun(tmp_path, "modules,data")
    for name, state in together.items():
        assert _equal(torch.load(tmp_path / f"modules-{name}.pt"), state), name
    for name, state in w.train_all(data_parallel=True).items():
        ddp = torch.load(tmp_path / f"data-{name}.pt")
        for key, value in state.items():
            assert torch.allclose(ddp[key], value, atol=1e-5, rtol=1e-4), (name, key)


def test_impossible_runs_are_refused_by_name_before_training(tmp_path: Path) -> None:
    four_ranks = DistContext(rank=0, world_size=4, local_rank=0)
    five = w.dictionaries()
    with pytest.raises(InvalidInputError, match="--distribute-modules over 4 ranks needs at least 4 dictionaries, got 2"):
        check_run(five[:2], w.source(), four_ranks, "modules")
    with pytest.raises(InvalidInputError, match="reads hooks \\['elsewhere'\\]"):
        torch.manual_seed(0)
        check_run([SAEDictionary(w.SAE_A, w.TRAIN.resolve(w.D, 48), hook="elsewhere")], w.source(), None, "data")
    with pytest.raises(InvalidInputError, match="names repeat"):
        train_dictionaries([five[0], five[0]], w.source())
    save_checkpoint(tmp_path, 4, {"step": 4, "model": {}, "rng": {}})  # a checkpoint of the trainer before the loop
    with pytest.raises(InvalidInputError, match="written by an earlier version of the trainer"):
        train_dictionaries(w.dictionaries()[:1], w.source(), checkpoint_dir=tmp_path)
    short = w.source()
    short.load_state_dict({"batches": 9})  # 3 of its 12 batches left
    with pytest.raises(InvalidInputError, match="ran out after 12 batches of 64 tokens"):
        train_dictionaries(w.dictionaries()[:1], short)


def test_cached_source_gives_each_hook_its_own_batches_and_resumes(tmp_path: Path) -> None:
    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    write_planted_atlas(tmp_path, hooks, d_in=8, n_atoms=16, n_blocks=12, context=16)
    readers = {h: ActivationReader(tmp_path, h) for h in hooks}
    src = CachedSource(readers, 32, seed=3)
    drawn = [src.next_batch() for _ in range(5)]
    for h in hooks:
        alone = readers[h].batches(32, seed=3, repeat=True)
        assert all(torch.equal(batch[h], next(alone)) for batch in drawn)
    again = CachedSource(readers, 32, seed=3)
    again.load_state_dict({"batches": 3})
    resumed = again.next_batch()
    assert all(torch.equal(resumed[h], drawn[3][h]) for h in hooks)
    with pytest.raises(InvalidInputError, match="does not mix cached and streamed sources"):
        again.load_state_dict({"source": "stream", "batches": 3})


ATLAS_HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
ATLAS_TIMED = {f"saes/{h}-topk-32/training.json": ("final_metrics.wall_seconds",) for h in ATLAS_HOOKS}


def _train_atlas(root: Path) -> None:
    train_saes(root, ATLAS_HOOKS, architecture="topk", d_sae=32, k=3,
               train_cfg=TrainConfig(total_tokens=64 * 12, batch_size=64, lr=3e-3, progress=False))


@pytest.fixture(scope="module")
def planted_atlas(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("planted") / "atlas"
    write_planted_atlas(base, ATLAS_HOOKS, d_in=8, n_atoms=24, n_blocks=12, context=16)
    work = fresh_copy(base, tmp_path_factory.mktemp("uninterrupted") / "atlas")
    _train_atlas(work)
    return base, timeless_tree(work, ATLAS_TIMED)


@pytest.mark.parametrize("point", [
    KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 2 * 9 + 2),  # step 9, both SAEs mid-way
    KillPoint("sae_atlas.saes.train.trainer._write_record", 1),  # first SAE's weights saved, no record yet
    KillPoint("sae_atlas.saes.train.trainer.remove_checkpoints", 1),  # first SAE finished, the second not saved
], ids=["mid-step", "between-weights-and-record", "between-the-two-saves"])
def test_atlas_training_of_several_saes_killed_resumes_to_identical_files(point: KillPoint, planted_atlas,
                                                                         tmp_path: Path) -> None:
    base, reference = planted_atlas
    work = fresh_copy(base, tmp_path / "atlas")
    run_until_killed(lambda: _train_atlas(work), point)
    _train_atlas(work)
    assert timeless_tree(work, ATLAS_TIMED) == reference  # no run checkpoints left behind either
