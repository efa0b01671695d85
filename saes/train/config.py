"""Training configuration, its validation and the defaults resolved against a run.

Defaults are sized for short CPU runs and scale with the run: the learning rate is larger
for runs of few steps (`default_lr`), the warm-up is at most 5% of the steps, the dead-latent window is a tenth of the run's tokens (capped at
sparsify's 10M), checkpoints are written every tenth of the run. `resolve` turns every
`None` into its concrete value so `training.json` records what was actually used.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.base import config_from_dict

BDecInit = Literal["geometric_median", "mean", "zero"]
B_DEC_INITS: tuple[BDecInit, ...] = get_args(BDecInit)


LrRule = Literal["budget", "gao2024"]
LR_RULES: tuple[LrRule, ...] = get_args(LrRule)
# The budget rule's largest multiplier (x10 won at 64 and 256 steps on real and planted data:
# bench/train_quality.py, BENCHMARKS.md "Quality per token against SAELens") and the step
# count from which it gives Gao et al.'s rate again (an assumption, not measured here).
LONG_RUN_STEPS = 25_600
MAX_SHORT_RUN_MULTIPLIER = 10.0


def default_lr(d_sae: int, total_steps: int | None = None, rule: LrRule = "budget") -> float:
    """Adam learning rate for an SAE of `d_sae` latents trained for `total_steps` steps.

    `gao2024` is `2e-4 / sqrt(d_sae / 2**14)` (Gao et al. 2024), a rate for long runs.
    `budget` multiplies it by `sqrt(LONG_RUN_STEPS / total_steps)`, clamped to
    [1, MAX_SHORT_RUN_MULTIPLIER]: a run of a few hundred steps must move its unit-norm
    decoder rows further per step to reach the same place.
    """
    base = 2e-4 / math.sqrt(d_sae / 2**14)
    if rule == "gao2024" or total_steps is None:
        return base
    return base * min(MAX_SHORT_RUN_MULTIPLIER, max(1.0, math.sqrt(LONG_RUN_STEPS / max(1, total_steps))))


@dataclass
class TrainConfig:
    """How to train one SAE; `None` fields are resolved from the run by `resolve`."""

    total_tokens: int = 2_000_000
    batch_size: int = 4096
    lr: float | None = None  # default_lr(d_sae, total_steps, lr_rule)
    lr_rule: LrRule = "budget"  # how the default lr is chosen when `lr` is None
    lr_warmup_steps: int | None = None  # min(1000, 5% of steps)
    lr_decay_fraction: float = 0.2  # linear decay to 0 over the last 20% of steps
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    checkpoint_every_tokens: int | None = None  # a tenth of the run; 0 disables
    dead_window_tokens: int | None = None  # min(10M, total_tokens / 10)
    k_aux: int | None = None  # d_in // 2
    aux_coefficient: float = 1.0 / 32.0
    scale_batches: int = 8  # batches used to estimate the input scale and variance
    normalize_inputs: bool = True  # scale inputs so E||x||^2 = d_in, folded at save
    b_dec_init: BDecInit = "geometric_median"
    seed: int = 0
    device: str = "cpu"
    log_every_steps: int = 10
    progress: bool = True

    def __post_init__(self) -> None:
        self.adam_betas = tuple(self.adam_betas)  # type: ignore[assignment]
        problems = []
        if self.total_tokens <= 0:
            problems.append(f"total_tokens must be > 0, got {self.total_tokens}")
        if self.batch_size <= 0:
            problems.append(f"batch_size must be > 0, got {self.batch_size}")
        elif self.total_tokens < self.batch_size:
            problems.append(
                f"total_tokens ({self.total_tokens}) must be at least one batch ({self.batch_size})"
            )
        if self.lr is not None and not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.lr_decay_fraction <= 1.0:
            problems.append(f"lr_decay_fraction must be in [0, 1], got {self.lr_decay_fraction}")
        if self.grad_clip < 0:
            problems.append(f"grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        if self.scale_batches < 1:
            problems.append(f"scale_batches must be >= 1, got {self.scale_batches}")
        if self.lr_rule not in LR_RULES:
            problems.append(f"lr_rule must be one of {', '.join(LR_RULES)}, got {self.lr_rule!r}")
        if self.b_dec_init not in B_DEC_INITS:
            problems.append(f"b_dec_init must be one of {', '.join(B_DEC_INITS)}, got {self.b_dec_init!r}")
        for name in ("lr_warmup_steps", "checkpoint_every_tokens", "dead_window_tokens", "k_aux"):
            value = getattr(self, name)
            if value is not None and value < 0:
                problems.append(f"{name} must be >= 0, got {value}")
        if self.log_every_steps < 1:
            problems.append(f"log_every_steps must be >= 1, got {self.log_every_steps}")
        if problems:
            raise InvalidInputError("invalid training config: " + "; ".join(problems))

    @property
    def total_steps(self) -> int:
        """Optimizer steps: whole batches within `total_tokens`."""
        return self.total_tokens // self.batch_size

    def resolve(self, d_in: int, d_sae: int) -> TrainConfig:
        """A copy with every `None` default replaced by its value for this SAE and run."""
        steps = self.total_steps
        return dataclasses.replace(
            self,
            lr=self.lr if self.lr is not None else default_lr(d_sae, steps, self.lr_rule),
            lr_warmup_steps=(
                self.lr_warmup_steps if self.lr_warmup_steps is not None else min(1000, steps // 20)
            ),
            checkpoint_every_tokens=(
                self.checkpoint_every_tokens
                if self.checkpoint_every_tokens is not None
                else max(self.batch_size, self.total_tokens // 10)
            ),
            dead_window_tokens=(
                self.dead_window_tokens
                if self.dead_window_tokens is not None
                else min(10_000_000, max(self.batch_size, self.total_tokens // 10))
            ),
            k_aux=self.k_aux if self.k_aux is not None else max(1, d_in // 2),
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["adam_betas"] = list(self.adam_betas)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict, rejecting unknown keys with the list of valid ones."""
        return config_from_dict(cls, data, "training config")
