"""torchrun with 2 CPU processes (gloo): a CLT trained data-parallel equals one trained in a
single process on the same global batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from sae_atlas.saes.transcoders.clt_train import train_clt
from tests.saes import clt_dist_worker as w

REPO = Path(__file__).resolve().parents[2]


def test_ddp_equals_single_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.saes.clt_dist_worker", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = train_clt(w.CFG, lambda skip: iter(w.batches(skip)), w.TRAIN)
    ddp = torch.load(tmp_path / "ddp.pt")
    for name, value in single.clt.state_dict().items():
        assert torch.allclose(ddp[name], value, atol=1e-5, rtol=1e-4), name
    history = json.loads((tmp_path / "history.json").read_text())
    assert [row["step"] for row in history] == [row["step"] for row in single.history] == [4, 8, 12]
    for a, b in zip(history, single.history, strict=True):  # the ranks' metrics averaged = the global batch's
        assert abs(a["fvu"] - b["fvu"]) < 1e-4 * max(1.0, b["fvu"])
