"""Shared definitions of the multi-dictionary loop tests, and their torchrun worker.

One tiny planted source gives two hooks at the same tokens (`HOOK_A`, and `HOOK_B` = a
fixed nonlinear map of it); five dictionaries read them: a TopK SAE on A, a JumpReLU SAE
on B, a skip transcoder A -> B, a crosscoder of A and B and a one-layer CLT A -> B.

`python -m torch.distributed.run --standalone --nproc_per_node=2 -m tests.saes.loop_worker
OUT_DIR MODES` trains them over two ranks (MODES: "data", "modules" or both, comma-separated,
one run after the other in one launch) and writes each folded
dictionary's state_dict to `OUT_DIR/<MODE>-<name>.pt` (rank 0 for data-parallel, each
dictionary's owner for module sharding). With a third argument, a `KillPoint` as JSON,
the run checkpoints into `OUT_DIR/run/` and every rank SIGKILLs itself at that point (run
again without it to resume). Data-parallel runs without AuxK and without the
crosscoder: both compute statistics of each rank's share of the batch (the AuxK
normaliser, BatchTopK's selection), see `saes.train.loop`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

from sae_atlas.saes.compare.crosscoder import CrosscoderDictionary, crosscoder_config
from sae_atlas.saes.distributed import DistContext, init_distributed
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.dictionary import Dictionary
from sae_atlas.saes.train.loop import Distribute, train_dictionaries
from sae_atlas.saes.train.sources import RowSource
from sae_atlas.saes.train.trainer import SAEDictionary
from sae_atlas.saes.transcoders.clt import CLTConfig
from sae_atlas.saes.transcoders.clt_train import CLTDictionary
from tests.saes.kill_points import KillPoint
from tests.saes.planted import planted_atoms, planted_batches

HOOK_A, HOOK_B = "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"
D, BATCH, STEPS = 16, 64, 12
TRAIN = TrainConfig(total_tokens=BATCH * STEPS, batch_size=BATCH, lr=3e-3, progress=False, log_every_steps=4,
                    checkpoint_every_tokens=2 * BATCH)
SAE_A = SAEConfig("topk", D, 48, k=3, seed=1, hook_name=HOOK_A)
SAE_B = SAEConfig("jumprelu", D, 48, seed=2, hook_name=HOOK_B)
TRANSCODER = SAEConfig("topk", D, 48, k=3, seed=3, skip=True, d_out=D, hook_name=HOOK_A, hook_name_out=HOOK_B,
                       apply_b_dec_to_input=False)
CROSSCODER = crosscoder_config(D, D, 48, 4, hook_name=HOOK_A)
CLT = CLTConfig("topk", n_layers=1, d_model=D, d_sae=32, k=3, seed=4)
DATA_PARALLEL = dataclasses.replace(TRAIN, dead_window_tokens=10**9)  # no latent counts as dead: no AuxK


def rows() -> list[torch.Tensor]:
    """Global batches `[BATCH, 2D]`: hook A's rows, then hook B's (a fixed map of A)."""
    mix = torch.randn(D, D, generator=torch.Generator().manual_seed(9)) / D**0.5
    return [torch.cat([a, torch.tanh(a @ mix) * 2], dim=1)
            for a in planted_batches(planted_atoms(D, 40), BATCH, STEPS, seed=5)]


def source(ctx: DistContext | None = None) -> RowSource:
    """Both hooks of `rows()` as one batch source (this rank's share of each batch)."""
    return RowSource(rows(), lambda r: {HOOK_A: r[:, :D], HOOK_B: r[:, D:]}, (HOOK_A, HOOK_B), (BATCH, 2 * D), ctx)


def dictionaries(train: TrainConfig = TRAIN, crosscoder: bool = True) -> list[Dictionary]:
    """The five dictionaries (four without the crosscoder), each built from its own seed."""
    built: list[Dictionary] = []
    for cfg in (SAE_A, SAE_B, TRANSCODER):
        torch.manual_seed(train.seed)
        built.append(SAEDictionary(cfg, train.resolve(cfg.d_in, cfg.d_sae), name=f"{cfg.architecture}-{cfg.seed}"))
    if crosscoder:
        built.append(CrosscoderDictionary(CROSSCODER, train.resolve(2 * D, 48), hook_a=HOOK_A, hook_b=HOOK_B, d_a=D))
    built.append(CLTDictionary(CLT, train.resolve(D, 32)))
    return built


def folded(d: Dictionary) -> dict[str, torch.Tensor]:
    """The state_dict of a dictionary folded to raw activations (what would be saved)."""
    result: Any = d.finish(None, None, wall_seconds=0.0)  # type: ignore[attr-defined]
    module = result.clt if isinstance(d, CLTDictionary) else result.sae
    return module.state_dict()


def train_all(checkpoint_dir: Path | None = None, ctx: DistContext | None = None,
              distribute: Distribute = "data", data_parallel: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """Train the five together (the data-parallel set with `data_parallel`); {name: folded
    state_dict} of this rank's dictionaries."""
    chosen = dictionaries(DATA_PARALLEL, crosscoder=False) if data_parallel else dictionaries()
    run = train_dictionaries(chosen, source(ctx), checkpoint_dir=checkpoint_dir, ctx=ctx, distribute=distribute)
    return {d.name: folded(d) for d in run.dictionaries}


def main() -> None:
    out, modes = Path(sys.argv[1]), sys.argv[2].split(",")
    if len(sys.argv) > 3:
        KillPoint(**json.loads(sys.argv[3])).install()
    ctx = init_distributed()
    assert ctx is not None and ctx.world_size == 2
    for mode in modes:
        states = train_all(out / f"run-{mode}", ctx, mode, data_parallel=mode == "data")  # type: ignore[arg-type]
        if mode == "modules" or ctx.is_main:
            for name, state in states.items():
                torch.save(state, out / f"{mode}-{name}.pt")


if __name__ == "__main__":
    main()
