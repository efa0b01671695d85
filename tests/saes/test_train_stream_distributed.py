"""Streamed training under torchrun (gloo): two ranks, each streaming its own lane of the
corpus, give the weights of one process that streams both lanes.

Module-sharded, each rank trains one SAE on the all-gathered whole batches: bit for bit the
one-process weights. Data-parallel, each rank steps both SAEs on its half and DDP averages
the gradients: equal up to float rounding (the mean of two half-batch gradients is summed in
another order than one full-batch gradient), within atol 1e-5 after 8 steps, with no latent
dead in the run (the AuxK loss normalises by the variance of each rank's own share, which
makes data-parallel a valid but different estimator; `saes.train.loop`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.models import load_model
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train_from_model import StreamOptions, train_from_model

REPO = Path(__file__).resolve().parents[2]
MODEL = {"kind": "tiny", "n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32, "seed": 4}
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
# no latent counts as dead within the run, so no AuxK term (its normaliser is a statistic of each rank's share)
TRAIN = TrainConfig(total_tokens=64 * 8, batch_size=64, scale_batches=2, dead_window_tokens=10**6, progress=False)


def run(root: str | Path, distribute: str, lanes: int | None) -> None:
    """The run both sides make (the worker calls it under torchrun with lanes=None: one per rank)."""
    stream = StreamOptions(CorpusSpec(context_size=16), batch_blocks=2, buffer_tokens=128, heldout_tokens=48,
                           lanes=lanes)
    train_from_model(load_model(MODEL, device="cpu", dtype="float32"), root, HOOKS, d_sae=32, k=4, train_cfg=TRAIN,
                     stream=stream, distribute=distribute)  # type: ignore[arg-type]


@pytest.mark.parametrize("distribute", ["modules", "data"])
def test_two_ranks_equal_one_process_streaming_both_lanes(distribute: str, tmp_path: Path) -> None:
    solo, dist = tmp_path / "solo", tmp_path / "dist"
    run(solo, distribute, lanes=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.saes.train_stream_worker", str(dist), distribute]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for hook in HOOKS:
        a, b = (load_atlas_sae(root, f"{hook}-topk-32") for root in (dist, solo))
        for name, param in a.state_dict().items():
            if distribute == "modules":
                assert torch.equal(param, b.state_dict()[name]), (hook, name)
            else:
                torch.testing.assert_close(param, b.state_dict()[name], atol=1e-5, rtol=1e-4)
