"""torchrun worker for test_distributed: DDP on one SAE and per-layer training of several.

`python -m torch.distributed.run --standalone --nproc_per_node=2 -m tests.saes.dist_worker
OUT_DIR ATLAS_DIR`: rank 0 writes the DDP-trained weights to `OUT_DIR/ddp.pt`; the ranks
split the atlas's hooks with `train_saes` (per-layer mode).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from sae_atlas.saes.distributed import init_distributed
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.saes.train.trainer import train_sae
from tests.saes.planted import planted_atoms, planted_batches

BATCH, STEPS = 128, 16
DDP_SAE = SAEConfig("topk", 32, 128, k=4, seed=1)
DDP_TRAIN = TrainConfig(total_tokens=BATCH * STEPS, batch_size=BATCH, lr=3e-3, progress=False,
                        dead_window_tokens=10**9, log_every_steps=4)
ATLAS_TRAIN = TrainConfig(total_tokens=64 * 12, batch_size=64, lr=3e-3, progress=False)


def ddp_batches() -> list[torch.Tensor]:
    return list(planted_batches(planted_atoms(32, 96), BATCH, STEPS, seed=7))


def main() -> None:
    out, atlas = Path(sys.argv[1]), Path(sys.argv[2])
    ctx = init_distributed()
    assert ctx is not None and ctx.world_size == 2
    result = train_sae(DDP_SAE, ddp_batches(), DDP_TRAIN, ctx=ctx)
    if ctx.is_main:
        torch.save(result.sae.state_dict(), out / "ddp.pt")
    train_saes(atlas, architecture="topk", d_sae=64, k=3, train_cfg=ATLAS_TRAIN)


if __name__ == "__main__":
    main()
