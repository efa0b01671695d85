"""torchrun with 2 CPU processes (gloo): DDP equals single-process training on the same
global batches, and per-layer distribution equals training the SAEs one by one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.saes.train.trainer import train_sae
from sae_atlas.store.layout import AtlasLayout
from tests.saes import dist_worker as w
from tests.saes.planted import one_thread, write_planted_atlas  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "blocks.2.hook_resid_post"]


def test_ddp_and_per_layer_match_single_process(tmp_path: Path) -> None:
    saelens = pytest.importorskip("sae_atlas.saes.formats.saelens")
    dist_atlas, solo_atlas = tmp_path / "dist", tmp_path / "solo"
    write_planted_atlas(dist_atlas, HOOKS)
    write_planted_atlas(solo_atlas, HOOKS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.saes.dist_worker", str(tmp_path), str(dist_atlas)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    single = train_sae(w.DDP_SAE, w.ddp_batches(), w.DDP_TRAIN).sae.state_dict()
    ddp = torch.load(tmp_path / "ddp.pt")
    for name, value in single.items():
        assert torch.allclose(ddp[name], value, atol=1e-5, rtol=1e-4), name

    solo = train_saes(solo_atlas, architecture="topk", d_sae=64, k=3, train_cfg=w.ATLAS_TRAIN)
    meta = AtlasLayout(dist_atlas).read_meta()
    assert sorted(meta["saes"]) == sorted(r["sae_id"] for r in solo.values())
    for hook, summary in solo.items():
        sae_id = summary["sae_id"]
        a = saelens.load_saelens(AtlasLayout(dist_atlas).sae_dir(sae_id)).state_dict()
        b = saelens.load_saelens(AtlasLayout(solo_atlas).sae_dir(sae_id)).state_dict()
        assert meta["saes"][sae_id]["hook"] == hook
        for name in b:
            assert torch.allclose(a[name], b[name], atol=1e-6), (sae_id, name)
