"""Streamed training survives kill -9 exactly: killed mid-step, mid-refill of the mixing
window or mid-checkpoint-write, the re-run leaves the files of an uninterrupted run, sha256
for sha256 (CPU, fp32), the SAE weights included.

The run: two SAEs, 12 steps of 32 tokens; a window is 4 forwards of 2 blocks (3 batches, then
4: window 0's leftover rows carry into window 1), the first 2 batches initialise, a checkpoint
every 5 steps (after batch 5: mid-window 1, so the resume recomputes window 0's carried tail).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.models import ModelHandle, tiny_model
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train_from_model import StreamOptions, train_from_model
from tests.saes.kill_points import KillPoint, run_until_killed, timeless_tree
from tests.saes.planted import one_thread  # noqa: F401

HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
TRAIN = TrainConfig(total_tokens=32 * 12, batch_size=32, scale_batches=2, checkpoint_every_tokens=32 * 5,
                    log_every_steps=3, progress=False)
STREAM = StreamOptions(CorpusSpec(context_size=16), batch_blocks=2, buffer_tokens=128, heldout_tokens=48)
TIMED = {f"saes/{hook}-topk-32/training.json": ["final_metrics.wall_seconds"] for hook in HOOKS}


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return tiny_model(n_layers=2, d_model=16, n_heads=2, d_mlp=32, seed=4)


def _run(handle: ModelHandle, root: Path) -> dict[str, Any]:
    return train_from_model(handle, root, HOOKS, d_sae=32, k=4, train_cfg=TRAIN, stream=STREAM)


@pytest.fixture(scope="module")
def reference(handle: ModelHandle, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("whole") / "atlas"
    _run(handle, root)
    return timeless_tree(root, TIMED)


@pytest.mark.parametrize("point", [
    KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 15),  # step 8, first SAE: after its backward
    KillPoint("sae_atlas.saes.streaming.run_hooks", 10),  # window 2's second forward (step 7's refill)
    KillPoint("torch.save", 2, "mid_write"),  # half of the step-10 checkpoint on disk, not yet renamed
], ids=["mid-step", "mid-refill", "mid-checkpoint-write"])
def test_killed_streamed_training_resumes_to_identical_files(point: KillPoint, handle: ModelHandle, tmp_path: Path,
                                                             reference: dict[str, Any]) -> None:
    root = tmp_path / "atlas"
    run_until_killed(lambda: _run(handle, root), point)
    assert list((root / "saes").glob(".train-*/checkpoints/step-*.pt"))  # it died after a checkpoint
    _run(handle, root)
    assert timeless_tree(root, TIMED) == reference
