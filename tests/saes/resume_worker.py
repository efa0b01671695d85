"""Subprocess for test_train_resume: a small planted TopK run that checkpoints into a folder.

`python -m tests.saes.resume_worker OUT_DIR HANG_AT` trains into `OUT_DIR/sae`; when the
batch source reaches batch HANG_AT it touches `OUT_DIR/ready` and sleeps, waiting to be
killed (HANG_AT < 0: run to the end).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.trainer import train_sae
from tests.saes.planted import planted_atoms, planted_batches

BATCH, STEPS = 128, 20
SAE_CFG = SAEConfig("topk", 32, 384, k=4, seed=3)
TRAIN_CFG = TrainConfig(
    total_tokens=BATCH * STEPS, batch_size=BATCH, lr=3e-3, checkpoint_every_tokens=4 * BATCH,
    dead_window_tokens=2 * BATCH, progress=False, seed=5, log_every_steps=2,
)


def batches(hang_at: int = -1, ready: Path | None = None):
    """A `skip -> iterator` batch source over a fixed planted stream."""
    atoms = planted_atoms(32, 96)

    def stream(skip: int) -> Iterator[torch.Tensor]:
        for i, batch in enumerate(planted_batches(atoms, BATCH, STEPS, seed=11)):
            if i == hang_at and ready is not None:
                ready.touch()
                time.sleep(3600)
            if i >= skip:
                yield batch

    return stream


def main() -> None:
    out, hang_at = Path(sys.argv[1]), int(sys.argv[2])
    train_sae(SAE_CFG, batches(hang_at, out / "ready"), TRAIN_CFG, out_dir=out / "sae")


if __name__ == "__main__":
    main()
