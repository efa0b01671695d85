"""torchrun worker for test_clt_distributed: a CLT trained data-parallel on two ranks.

`python -m torch.distributed.run --standalone --nproc_per_node=2 -m tests.saes.clt_dist_worker
OUT_DIR`: rank 0 writes the trained weights to `OUT_DIR/ddp.pt` and `OUT_DIR/history.json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from sae_atlas.saes.distributed import init_distributed
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.transcoders.clt import CLTConfig
from sae_atlas.saes.transcoders.clt_train import train_clt

BATCH, STEPS = 64, 12
CFG = CLTConfig(architecture="jumprelu", n_layers=3, d_model=8, d_sae=16, l0_coefficient=1e-3, seed=2)
TRAIN = TrainConfig(total_tokens=BATCH * STEPS, batch_size=BATCH, lr=3e-3, progress=False, log_every_steps=4)


def batches(skip: int = 0) -> list[torch.Tensor]:
    """Seeded rows `[B, 2, 3, 8]` whose outputs are a fixed ReLU map of the inputs."""
    gen = torch.Generator().manual_seed(5)
    W = torch.randn(3, 8, 8, generator=gen)
    out = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 3, 8, generator=gen)
        out.append(torch.stack([x, torch.einsum("bld,lde->ble", x, W).relu()], dim=1))
    return out[skip:]


def main() -> None:
    out = Path(sys.argv[1])
    ctx = init_distributed()
    assert ctx is not None and ctx.world_size == 2
    result = train_clt(CFG, lambda skip: iter(batches(skip)), TRAIN, ctx=ctx)
    if ctx.is_main:
        torch.save(result.clt.state_dict(), out / "ddp.pt")
        (out / "history.json").write_text(json.dumps(result.history))


if __name__ == "__main__":
    main()
