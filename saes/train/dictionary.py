"""The one training protocol every dictionary kind meets (SAE, transcoder, CLT, crosscoder).

A `Dictionary` is one dictionary being trained: its module, Adam (fused) with the
warm-up/decay schedule, step and token counters, the log window and history, and the
data-derived scales. The loop (`saes.train.loop`) hands it batches `{hook: rows}` from an
`ActivationSource`; the shared parts live here once:

- the optimizer step: loss, backward, the kind's decoder-gradient projection, gradient
  clipping, Adam, the kind's decoder renormalisation, the scheduler, the counters;
- the log window: every `log_every_steps` (and at the end) the window's mean metrics,
  averaged over the ranks that split the batch, become a history row;
- the checkpoint state and its config check on resume.

A kind supplies what differs: the hooks it reads and how a batch becomes its scaled
`(input, target)`, the initialisation from the first global batches (scales, target
variance, `b_dec`), its `StepInfo`, the decoder projection/normalisation, extra state
(scales, dead-latent counters) and how the finished dictionary is folded and saved.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.distributed import DistContext, all_reduce_
from sae_atlas.saes.sae.losses import StepInfo, TrainStep
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.schedule import make_scheduler
from sae_atlas.saes.train.sources import Batch

_UNCHECKED_ON_RESUME = ("progress", "device", "log_every_steps")


class _LossModule(nn.Module):
    """Wraps `module.training_loss` as `forward` so DistributedDataParallel can drive it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.sae = module

    def forward(
        self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict, torch.Tensor]:
        out: TrainStep = self.sae.training_loss(x, info, target)
        return out.loss, out.metrics, out.fired


def loss_module(module: nn.Module) -> nn.Module:
    """`module.training_loss` as a module whose forward returns (loss, metrics, fired)."""
    return _LossModule(module)


def optimizer_step(
    model: nn.Module, module: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, info: StepInfo,
    grad_clip: float, target: torch.Tensor | None, project: Callable[[], None], normalise: Callable[[], None],
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """One step: loss, backward, decoder-gradient projection (`project`), clipping, Adam,
    decoder renormalisation (`normalise`). `model` is `loss_module(module)`, possibly
    DDP-wrapped; `target` None reconstructs `x`. Returns the loss, the detached metrics and
    the per-latent firing counts of this rank's rows."""
    loss, metrics, fired = model(x, info, target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    project()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(module.parameters(), grad_clip)
    optimizer.step()
    normalise()
    return loss, metrics, fired


def make_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.Adam:
    """Adam (the fused kernel) over all parameters with the config's lr, betas and eps."""
    return torch.optim.Adam(module.parameters(), lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, fused=True)


def summarise_window(window: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the rows of a logging window that have it (sorted keys)."""
    keys = sorted({k for row in window for k in row})
    return {k: sum(vals) / len(vals) for k in keys if (vals := [r[k] for r in window if k in r])}


def check_same_config(state: dict[str, Any], kind_cfg: Any, cfg: TrainConfig) -> None:
    """InvalidInputError when a checkpoint's configs (`sae_config`, `train_config`) differ
    from the run's (`kind_cfg` has `to_dict`: an SAE's or a CLT's config)."""
    old_train = {k: v for k, v in state["train_config"].items() if k not in _UNCHECKED_ON_RESUME}
    new_train = {k: v for k, v in cfg.to_dict().items() if k not in _UNCHECKED_ON_RESUME}
    diff = sorted(
        [k for k in set(old_train) | set(new_train) if old_train.get(k) != new_train.get(k)]
        + [k for k, v in kind_cfg.to_dict().items() if state["sae_config"].get(k) != v]
    )
    if diff:
        raise InvalidInputError(
            f"a checkpoint with a different configuration exists (differs in {', '.join(diff)}); "
            "delete the SAE's checkpoints/ folder (or pass overwrite) to start afresh"
        )


class Dictionary(ABC):
    """One dictionary in training (see module doc). `name` keys its state in a run's
    checkpoint and must be unique in the run; `hooks` are the batch keys it reads; `train`
    is its resolved `TrainConfig`; `kind_cfg` its architecture config (`to_dict`)."""

    def __init__(self, name: str, hooks: tuple[str, ...], module: nn.Module, kind_cfg: Any,
                 train: TrainConfig, device: str) -> None:
        self.name, self.hooks, self.module, self.kind_cfg = name, hooks, module, kind_cfg
        self.train, self.device = train, device
        self.model = loss_module(module)
        self.optimizer = make_optimizer(module, train)
        self.scheduler = make_scheduler(self.optimizer, train.total_steps, train.lr_warmup_steps,
                                        train.lr_decay_fraction)
        self.ctx: DistContext | None = None  # the ranks that split this dictionary's batches
        self.step = 0
        self.tokens_seen = 0
        self.data_variance: float | None = None
        self.history: list[dict[str, float]] = []
        self.log_window: list[dict[str, float]] = []  # step metrics since the last history row

    # -- what a kind supplies -------------------------------------------------------------

    def first_batches(self) -> int:
        """How many first global batches `initialise` reads."""
        return min(self.train.scale_batches, self.train.total_steps)

    @abstractmethod
    def initialise(self, first: list[Batch]) -> None:
        """Scales, target variance and `b_dec` from the first global batches (whole batches,
        not rank shares)."""

    @abstractmethod
    def inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scaled float32 `(input, target)` of a batch on the device (target None: the input)."""

    @abstractmethod
    def step_info(self) -> StepInfo:
        """What the loss needs to know about this step."""

    @abstractmethod
    def project_decoder_grad(self) -> None:
        """Remove the gradient components that would change the decoder norms."""

    @abstractmethod
    def normalise_decoder(self) -> None:
        """Rescale the decoder to unit norm after the optimizer step."""

    def after_step(self, fired: torch.Tensor) -> None:  # noqa: B027 - optional hook, nothing by default
        """Bookkeeping after a step from the per-latent firing counts of this rank's rows."""

    def log_extra(self) -> dict[str, float]:
        """Extra history fields of a kind (e.g. the dead fraction)."""
        return {}

    def extra_state(self) -> dict[str, Any]:
        """The kind's own checkpoint state (scales, counters)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore `extra_state` from a checkpoint."""

    # -- the shared protocol --------------------------------------------------------------

    def distribute(self, ctx: DistContext | None) -> None:
        """Train data-parallel over `ctx`'s ranks (gradients averaged by DDP); None: alone."""
        self.ctx = ctx
        if ctx is not None and ctx.world_size > 1:
            self.model = nn.parallel.DistributedDataParallel(self.model)

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on this rank's rows; returns the step's metrics."""
        x, target = self.inputs(batch)
        loss, metrics, fired = optimizer_step(self.model, self.module, self.optimizer, x, self.step_info(),
                                              self.train.grad_clip, target, self.project_decoder_grad,
                                              self.normalise_decoder)
        self.scheduler.step()
        self.after_step(fired)
        self.step += 1
        self.tokens_seen += self.train.batch_size
        row = {k: float(v) for k, v in metrics.items()}
        row["loss"] = float(loss.detach())
        return row

    def log(self, row: dict[str, float]) -> None:
        """Add a step's metrics to the window; every `log_every_steps` (and at the end) append
        the window's means, averaged over ranks, to the history."""
        self.log_window.append(row)
        if self.step % self.train.log_every_steps and self.step != self.train.total_steps:
            return
        summary = summarise_window(self.log_window)
        means = all_reduce_(torch.tensor(list(summary.values()), dtype=torch.float64), self.ctx, "mean")
        summary = dict(zip(summary, means.tolist(), strict=True))
        summary.update(step=self.step, tokens=self.tokens_seen, lr=self.scheduler.get_last_lr()[0])
        summary.update(self.log_extra())
        self.history.append(summary)
        self.log_window = []

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint holds of this dictionary."""
        return {
            "sae_config": self.kind_cfg.to_dict(), "train_config": self.train.to_dict(),
            "model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "step": self.step, "tokens_seen": self.tokens_seen,
            "data_variance": self.data_variance, "history": self.history, "log_window": self.log_window,
            **self.extra_state(),
        }

    def load(self, state: dict[str, Any]) -> None:
        """Continue from `state` (InvalidInputError naming the fields when the configs differ)."""
        check_same_config(state, self.kind_cfg, self.train)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.data_variance, self.history, self.log_window = state["data_variance"], state["history"], state["log_window"]
        self.load_extra_state(state)
