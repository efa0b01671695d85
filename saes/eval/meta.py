"""`meta`: how much of the SAE's decoder a small BatchTopK meta-SAE explains.

A meta-SAE (Bussmann et al. 2024, "Showing SAE latents are not atomic using meta-SAEs";
SAEBench's `meta_structure` eval) is a BatchTopK SAE (`saes.sae.batchtopk`, trained with
`saes.train.trainer.train_sae`) of width `ceil(width_ratio * d_sae)` (at least `k`)
trained on the SAE's decoder rows, sampled with replacement in seeded batches. Reported
(SAEBench's names, category `meta_structure`): `decoder_fraction_variance_explained` =
`1 - sum ||w - w_hat||^2 / sum ||w - mean(w)||^2` over all decoder rows `w`,
`final_reconstruction_mse` (per element) and `train_time_seconds`. A dictionary whose
latents are compositions of a few shared parts scores high; unrelated directions low.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.reconstruction import reconstruction_metrics
from sae_atlas.saes.train.trainer import train_sae


@dataclass(frozen=True)
class MetaConfig:
    """Meta-SAE width (a fraction of the SAE's), its mean L0 `k`, training steps, rows per
    batch, learning rate (None: the trainer's default) and seed."""

    width_ratio: float = 0.25
    k: int = 4
    train_steps: int = 2000
    train_batch_size: int = 512
    learning_rate: float | None = None
    seed: int = 0


def decoder_batches(decoder_FD: torch.Tensor, batch_size: int, seed: int) -> Callable[[int], Iterator[torch.Tensor]]:
    """A resumable batch source: batch `i` of rows drawn with replacement by a seeded generator."""

    def batches(skip: int) -> Iterator[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        step = 0
        while True:
            rows = torch.randint(0, decoder_FD.shape[0], (batch_size,), generator=gen)
            if step >= skip:
                yield decoder_FD[rows]
            step += 1

    return batches


def run_meta(inputs: EvalInputs, config: MetaConfig) -> EvalOutcome:
    """Train the meta-SAE on the decoder rows and score its reconstruction of them."""
    decoder = inputs.sae.W_dec.detach().float().cpu()
    width = max(math.ceil(decoder.shape[0] * config.width_ratio), config.k)
    meta_cfg = SAEConfig(architecture="batchtopk", d_in=decoder.shape[1], d_sae=width, k=config.k, seed=config.seed)
    train_cfg = TrainConfig(total_tokens=config.train_steps * config.train_batch_size,
                            batch_size=config.train_batch_size, lr=config.learning_rate, seed=config.seed,
                            device=inputs.device, checkpoint_every_tokens=0, progress=False)
    started = time.perf_counter()
    result = train_sae(meta_cfg, decoder_batches(decoder, config.train_batch_size, config.seed), train_cfg)
    seconds = time.perf_counter() - started
    scores = reconstruction_metrics(result.sae, [decoder])
    metrics = {"decoder_fraction_variance_explained": scores["explained_variance"],
               "final_reconstruction_mse": scores["mse"], "train_time_seconds": seconds,
               "meta_width": width, "meta_l0": scores["l0"]}
    return EvalOutcome({"meta_structure": metrics})


META: EvalSpec[MetaConfig] = EvalSpec("meta", "meta_structure", MetaConfig, run_meta)
