"""A SIGKILLed training run resumes from its latest valid checkpoint to the same weights."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.train.checkpoint import load_latest_checkpoint
from sae_atlas.saes.train.trainer import train_sae
from tests.saes import resume_worker as w
from tests.saes.planted import one_thread  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def _kill_during_step(tmp_path: Path, hang_at: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.saes.resume_worker", str(tmp_path), str(hang_at)],
        cwd=REPO, env=env,
    )
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None, "worker exited early"
            assert time.monotonic() < deadline, "worker never reached the hang point"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_sigkilled_run_resumes_to_identical_weights(tmp_path: Path) -> None:
    pytest.importorskip("sae_atlas.saes.formats.saelens")
    _kill_during_step(tmp_path, hang_at=14)
    sae_dir = tmp_path / "sae"
    names = sorted(p.name for p in (sae_dir / "checkpoints").iterdir())
    assert names == ["step-00000008.pt", "step-00000012.pt"]  # checkpoints every 4 batches, 2 kept
    (sae_dir / "checkpoints" / "step-00000013.pt").write_bytes(b"truncated junk")  # not valid
    assert load_latest_checkpoint(sae_dir)["step"] == 12

    changed = dataclasses.replace(w.TRAIN_CFG, lr=1e-3)
    with pytest.raises(InvalidInputError, match="differs in lr"):
        train_sae(w.SAE_CFG, w.batches(), changed, out_dir=sae_dir)

    resumed = train_sae(w.SAE_CFG, w.batches(), w.TRAIN_CFG, out_dir=sae_dir)
    straight = train_sae(w.SAE_CFG, w.batches(), w.TRAIN_CFG)
    assert resumed.resumed_from_step == 12 and straight.resumed_from_step is None
    assert all("auxk" in h for h in resumed.history[5:])  # dead latents live across the kill
    for name, value in straight.sae.state_dict().items():
        assert torch.allclose(resumed.sae.state_dict()[name], value, atol=1e-6, rtol=1e-5), name
    assert [h["step"] for h in resumed.history] == [h["step"] for h in straight.history]
    assert not (sae_dir / "checkpoints").exists()  # removed after the final save
    assert (sae_dir / "training.json").exists() and (sae_dir / "cfg.json").exists()
