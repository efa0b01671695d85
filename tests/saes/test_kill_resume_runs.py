"""kill -9 at named points of the import of a circuit-tracer CLT and of a two-rank torchrun
training run; the re-run leaves exactly the files of an uninterrupted run.

Each killed run is a child process that SIGKILLs itself at a monkeypatched call
(`tests.saes.kill_points`; under torchrun every rank dies at the point, `kill_worker`).
Fields that legitimately differ between two runs are dropped where named: the CLT import's
time stamp (`source.json` imported_at) and wall time (`eval.json` seconds), and a training
run's wall time (`training.json` final_metrics.wall_seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.importing.clt import import_clt
from sae_atlas.saes.models import ModelHandle, tiny_model
from tests.saes.kill_points import (
    REPO,
    KillPoint,
    fresh_copy,
    killed_then_resumed,
    timeless_tree,
    uninterrupted,
)
from tests.saes.planted import one_thread, write_planted_atlas  # noqa: F401
from tests.saes.test_clt_import import _exact_clt

# CLT import -------------------------------------------------------------------------------

CLT_ID, CLT_SOURCE = "clt", "clt-source"
CLT_TIMED = {f"clts/{CLT_ID}/source.json": ("imported_at",), f"clts/{CLT_ID}/eval.json": ("seconds",)}


def _relu_model() -> ModelHandle:
    return tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)


def clt_import_job(root: Path) -> object:
    return import_clt(root, root.parent / CLT_SOURCE, clt_id=CLT_ID, model_handle=_relu_model(), n_tokens=256)


@pytest.fixture(scope="module")
def clt_atlas(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(an atlas of the tiny ReLU model, the folder its runs use), the CLT source beside both."""
    base, work = tmp_path_factory.mktemp("clt") / "atlas", tmp_path_factory.mktemp("clt-work") / "atlas"
    handle = _relu_model()
    cache_activations(handle, base, ["blocks.1.hook_mlp_out"], corpus=CorpusSpec(context_size=16), n_tokens=16 * 20,
                      progress=False)
    _exact_clt(work.parent / CLT_SOURCE, handle)
    return base, work


@pytest.mark.parametrize("point", [
    pytest.param(KillPoint("sae_atlas.saes.importing.clt.judge", 1), id="measuring"),
    pytest.param(KillPoint("os.replace", 1, path_arg=0, matching=f"*/.import-staging/{CLT_ID}"), id="staged"),
    pytest.param(KillPoint("sae_atlas.saes.importing.clt.register_clt", 1), id="moved-not-registered"),
])
def test_clt_import_killed_reruns_to_identical_files(clt_atlas: tuple[Path, Path], point: KillPoint) -> None:
    base, work = clt_atlas
    job = f"{__name__}.clt_import_job"
    assert killed_then_resumed(job, base, work, point, CLT_TIMED) == uninterrupted(job, base, work, CLT_TIMED)


# torchrun: two ranks training one SAE with DDP ------------------------------------------

HOOK = "blocks.0.hook_resid_post"
TRAIN_RECORD = f"saes/{HOOK}-topk-64/training.json"


def _torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_two_rank_training_run_killed_resumes_to_the_files_of_an_uninterrupted_one(tmp_path: Path) -> None:
    base, work = tmp_path / "base", tmp_path / "work"
    write_planted_atlas(base, [HOOK], d_in=16, n_atoms=48, n_blocks=40, context=32)
    (tmp_path / "train.toml").write_text("progress = false\nlog_every_steps = 1\n")
    train = ["train", str(work), "--hook", HOOK, "--arch", "topk", "--d-sae", "64", "--k", "4",
             "--tokens", str(64 * 12), "--batch-size", "64", "--config", str(tmp_path / "train.toml"), "--json"]
    timed = {TRAIN_RECORD: ("final_metrics.wall_seconds",)}
    fresh_copy(base, work)
    done = _torchrun("-m", "sae_atlas", *train)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = timeless_tree(work, timed)
    fresh_copy(base, work)
    point = KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 7)  # step 7 on every rank, checkpoints behind
    killed = _torchrun("-m", "tests.saes.kill_worker", json.dumps(point.__dict__), *train)
    assert killed.returncode != 0 and f"exitcode  : -{signal.SIGKILL}" in killed.stderr, killed.stderr[-3000:]
    assert not (work / TRAIN_RECORD).exists(), "the run finished before it was killed"
    resumed = _torchrun("-m", "sae_atlas", *train)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert timeless_tree(work, timed) == reference
