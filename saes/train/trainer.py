"""Train one SAE from a stream of activation batches, resumably.

`train_sae` runs Adam with a warm-up/decay schedule and gradient clipping, keeps decoder
rows at unit norm (the gradient component parallel to each row is removed before the step
and rows are renormalised after), initialises `b_dec` at the geometric median of the first
batch, scales inputs by one scalar so `E||x||^2 = d_in` (estimated on the first batches,
folded into the weights of the returned SAE), tracks dead latents in tokens for AuxK, and
checkpoints atomically so a killed run resumes from the latest valid checkpoint with the
data stream continued exactly (same seed: same final weights).

A transcoder trains the same way on paired rows `[B, d_in + d_out]`
(`saes.transcoders.pairs`): it reads the input part and predicts the output part, which is
scaled by its own scalar (`E||y||^2 = d_out`); `b_dec` (its output bias) starts at the
geometric median of the targets and the FVU is measured against the targets' variance.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from sae_atlas.saes.distributed import DistContext, all_reduce_
from sae_atlas.saes.eval.reconstruction import reconstruction_stats
from sae_atlas.saes.formats.saelens import save_saelens
from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.sae.losses import StepInfo, TrainStep
from sae_atlas.saes.sae.registry import build_sae
from sae_atlas.saes.train.checkpoint import (
    load_latest_checkpoint,
    remove_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.distributed import rank_slice
from sae_atlas.saes.train.geometric_median import geometric_median
from sae_atlas.saes.train.scaling import fold_input_scale, input_scale
from sae_atlas.saes.train.schedule import make_scheduler
from sae_atlas.saes.transcoders.pairs import input_and_target, row_width
from sae_atlas.store.atomic import atomic_write_json
from sae_atlas.store.errors import InvalidInputError
from sae_atlas.store.layout import created_with

# A batch source: any iterable of [B, d_in] tensors ([B, d_in + d_out] paired rows for a
# transcoder), or a function `skip -> iterator` that
# starts the stream after `skip` batches (e.g. `lambda s: reader.batches(B, skip_batches=s)`).
BatchSource = Iterable[torch.Tensor] | Callable[[int], Iterator[torch.Tensor]]
_UNCHECKED_ON_RESUME = ("progress", "device", "log_every_steps")


@dataclass
class TrainResult:
    """A finished run: the SAE folded to raw activations (eval mode) and its metrics."""

    sae: SAE
    final_metrics: dict[str, float]
    heldout_metrics: dict[str, Any] | None
    history: list[dict[str, float]]
    input_scale: float
    train_config: TrainConfig
    resumed_from_step: int | None = None
    record: dict[str, Any] = field(default_factory=dict)  # the training.json content


def _open_stream(batches: BatchSource, skip: int) -> Iterator[torch.Tensor]:
    if callable(batches):
        return iter(batches(skip))
    return itertools.islice(iter(batches), skip, None)


class _LossModule(nn.Module):
    """Wraps `sae.training_loss` as `forward` so DistributedDataParallel can drive it."""

    def __init__(self, sae: SAE) -> None:
        super().__init__()
        self.sae = sae

    def forward(
        self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict, torch.Tensor]:
        out: TrainStep = self.sae.training_loss(x, info, target)
        return out.loss, out.metrics, out.fired


@torch.no_grad()
def project_decoder_grad(sae: SAE) -> None:
    """Remove from each decoder row's gradient its component along the (unit) row."""
    if sae.W_dec.grad is not None:
        W, G = sae.W_dec, sae.W_dec.grad
        G.sub_((G * W).sum(-1, keepdim=True) * W)


@torch.no_grad()
def normalise_decoder(sae: SAE) -> None:
    """Rescale every decoder row to unit norm."""
    sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12))


def optimizer_step(
    model: nn.Module, sae: SAE, optimizer: torch.optim.Optimizer, x: torch.Tensor,
    info: StepInfo, grad_clip: float, target: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """One training step: loss, backward, decoder-gradient projection, clip, Adam, renorm.

    `model` is the loss module (`loss_module(sae)`, possibly DDP-wrapped); `target` is a
    transcoder's output batch (None: reconstruct `x`). Returns the loss, the detached
    metrics and the per-latent firing counts of this rank's batch.
    """
    loss, metrics, fired = model(x, info, target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    project_decoder_grad(sae)
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(sae.parameters(), grad_clip)
    optimizer.step()
    normalise_decoder(sae)
    return loss, metrics, fired


def make_optimizer(sae: SAE, cfg: TrainConfig) -> torch.optim.Adam:
    """Adam (the fused kernel) over all SAE parameters with the config's lr, betas and eps."""
    return torch.optim.Adam(sae.parameters(), lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, fused=True)


def loss_module(sae: SAE) -> nn.Module:
    """`sae.training_loss` as a module whose forward returns (loss, metrics, fired)."""
    return _LossModule(sae)


class _Run:
    """The mutable state of one training run (everything a checkpoint holds)."""

    def __init__(self, sae_cfg: SAEConfig, cfg: TrainConfig, device: str, ctx: DistContext | None):
        self.sae_cfg, self.cfg, self.device, self.ctx = sae_cfg, cfg, device, ctx
        self.sae = build_sae(sae_cfg).to(device)
        normalise_decoder(self.sae)
        self.optimizer = make_optimizer(self.sae, cfg)
        self.scheduler = make_scheduler(
            self.optimizer, cfg.total_steps, cfg.lr_warmup_steps, cfg.lr_decay_fraction
        )
        self.step = 0
        self.tokens_seen = 0
        self.since_fired = torch.zeros(sae_cfg.d_sae, dtype=torch.int64, device=device)
        self.scale = 1.0
        self.output_scale = 1.0  # a transcoder's target scale (an SAE's is `scale`)
        self.data_variance: float | None = None
        self.history: list[dict[str, float]] = []
        self.log_window: list[dict[str, float]] = []  # step metrics since the last history row

    def state(self) -> dict[str, Any]:
        return {
            "sae_config": self.sae_cfg.to_dict(),
            "train_config": self.cfg.to_dict(),
            "model": self.sae.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "since_fired": self.since_fired.cpu(),
            "input_scale": self.scale,
            "output_scale": self.output_scale,
            "data_variance": self.data_variance,
            "history": self.history,
            "log_window": self.log_window,
        }

    def load(self, state: dict[str, Any]) -> None:
        check_same_config(state, self.sae_cfg, self.cfg)
        self.sae.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.tokens_seen = state["tokens_seen"]
        self.since_fired = state["since_fired"].to(self.device)
        self.scale = state["input_scale"]
        self.output_scale = state.get("output_scale", self.scale)  # absent in checkpoints of earlier versions
        self.data_variance = state["data_variance"]
        self.history = state["history"]
        self.log_window = state.get("log_window", [])  # absent in checkpoints of earlier versions


def check_same_config(state: dict[str, Any], sae_cfg: Any, cfg: TrainConfig) -> None:
    """InvalidInputError when a checkpoint's configs (`sae_config`, `train_config`) differ
    from the run's (`sae_cfg` has `to_dict`: an SAE's or a CLT's config)."""
    old_train = {k: v for k, v in state["train_config"].items() if k not in _UNCHECKED_ON_RESUME}
    new_train = {k: v for k, v in cfg.to_dict().items() if k not in _UNCHECKED_ON_RESUME}
    diff = sorted(
        [k for k in set(old_train) | set(new_train) if old_train.get(k) != new_train.get(k)]
        + [k for k, v in sae_cfg.to_dict().items() if state["sae_config"].get(k) != v]
    )
    if diff:
        raise InvalidInputError(
            f"a checkpoint with a different configuration exists (differs in {', '.join(diff)}); "
            "delete the SAE's checkpoints/ folder (or pass overwrite) to start afresh"
        )


@torch.no_grad()
def _initialise_from_data(run: _Run, first: list[torch.Tensor]) -> None:
    """Input (and a transcoder's target) scale and the target variance from the first global
    batches; `b_dec` init from the first batch's targets."""
    cfg, sae_cfg = run.cfg, run.sae_cfg
    x, y = input_and_target(sae_cfg, torch.cat(first).to(run.device, torch.float64))
    if cfg.normalize_inputs:
        run.scale = input_scale(float(x.pow(2).sum()), x.shape[0], sae_cfg.d_in)
        run.output_scale = (input_scale(float(y.pow(2).sum()), y.shape[0], sae_cfg.output_dim)
                            if sae_cfg.is_transcoder else run.scale)
    scaled = y * run.output_scale
    run.data_variance = float((scaled - scaled.mean(0)).pow(2).sum(-1).mean())
    first_batch = input_and_target(sae_cfg, first[0].to(run.device, torch.float64))[1] * run.output_scale
    if cfg.b_dec_init == "geometric_median":
        run.sae.b_dec.copy_(geometric_median(first_batch))
    elif cfg.b_dec_init == "mean":
        run.sae.b_dec.copy_(first_batch.mean(0))


def _checked(batch: torch.Tensor | None, step: int, cfg: TrainConfig, width: int) -> torch.Tensor:
    """The batch, or InvalidInputError when the stream ended early or the shape is wrong."""
    if batch is None:
        raise InvalidInputError(
            f"the batch source ran out after {step} batches; the run needs "
            f"{cfg.total_steps} batches of {cfg.batch_size} tokens"
        )
    if tuple(batch.shape) != (cfg.batch_size, width):
        raise InvalidInputError(
            f"expected batches of shape ({cfg.batch_size}, {width}), got {tuple(batch.shape)}"
        )
    return batch


def summarise_window(window: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the rows of a logging window that have it (sorted keys)."""
    keys = sorted({k for row in window for k in row})
    return {k: sum(vals) / len(vals) for k in keys if (vals := [r[k] for r in window if k in r])}


def _write_record(out_dir: Path, record: dict[str, Any]) -> None:
    atomic_write_json(Path(out_dir) / "training.json", record)


class _Loop:
    """The named steps of the training loop over one `_Run`: step, log, maybe-checkpoint."""

    def __init__(self, run: _Run, out: Path | None, last: int) -> None:
        self.run, self.out, self.last = run, out, last
        self.cfg, self.ctx = run.cfg, run.ctx
        self.is_main = self.ctx is None or self.ctx.is_main
        model = loss_module(run.sae)
        if self.ctx is not None and self.ctx.world_size > 1:
            model = nn.parallel.DistributedDataParallel(model)
        self.model = model

    def step(self, batch: torch.Tensor) -> dict[str, float]:
        """One optimizer step on this rank's slice of a global batch; updates the step and
        token counters and the dead-latent counters (all-reduced); returns the step's metrics."""
        run, cfg = self.run, self.cfg
        x, y = input_and_target(run.sae_cfg, rank_slice(batch, self.ctx).to(run.device, torch.float32))
        x = x * run.scale
        target = y * run.output_scale if run.sae_cfg.is_transcoder else None
        info = StepInfo(
            step=run.step,
            total_steps=cfg.total_steps,
            dead_mask=run.since_fired >= cfg.dead_window_tokens,
            k_aux=cfg.k_aux,
            aux_coefficient=cfg.aux_coefficient,
            data_variance=run.data_variance,
        )
        loss, metrics, fired = optimizer_step(self.model, run.sae, run.optimizer, x, info, cfg.grad_clip, target)
        run.scheduler.step()
        with torch.no_grad():
            all_reduce_(fired, self.ctx)
            run.since_fired.add_(cfg.batch_size).masked_fill_(fired > 0, 0)
        run.step += 1
        run.tokens_seen += cfg.batch_size
        row = {k: float(v) for k, v in metrics.items()}
        row["loss"] = float(loss.detach())
        return row

    def log(self, row: dict[str, float]) -> None:
        """Add a step's metrics to the window; every `log_every_steps` (and at the end) append
        the window's means, averaged over ranks, to the history."""
        run, cfg = self.run, self.cfg
        run.log_window.append(row)
        if run.step % cfg.log_every_steps and run.step != cfg.total_steps:
            return
        summary = summarise_window(run.log_window)
        summary_t = torch.tensor(list(summary.values()), dtype=torch.float64)
        summary = dict(zip(summary, all_reduce_(summary_t, self.ctx, "mean").tolist(), strict=True))
        summary.update(
            step=run.step, tokens=run.tokens_seen, lr=run.scheduler.get_last_lr()[0],
            dead_fraction=float((run.since_fired >= cfg.dead_window_tokens).float().mean()),
        )
        run.history.append(summary)
        run.log_window = []

    def maybe_checkpoint(self) -> None:
        """Checkpoint (main rank, with an out_dir, before the last step) when the run crossed a
        multiple of `checkpoint_every_tokens` or reached the requested stop."""
        run, cfg, every = self.run, self.cfg, self.cfg.checkpoint_every_tokens
        crossed = every and run.tokens_seen // every > (run.tokens_seen - cfg.batch_size) // every
        if self.out is not None and self.is_main and run.step < cfg.total_steps and (crossed or run.step == self.last):
            save_checkpoint(self.out, run.step, run.state())


def _start(run: _Run, batches: BatchSource, out: Path | None) -> tuple[Iterator[torch.Tensor], int | None]:
    """Resume `run` from the latest checkpoint in `out` (returning its step), or initialise it
    from the first batches; returns the batch stream positioned at `run.step`."""
    cfg, width = run.cfg, row_width(run.sae_cfg)
    resumed = None
    if out is not None and (state := load_latest_checkpoint(out, map_location=run.device)) is not None:
        run.load(state)
        resumed = run.step
    stream = _open_stream(batches, run.step)
    if resumed is None:
        n_first = min(cfg.scale_batches, cfg.total_steps)
        first = [_checked(next(stream, None), i, cfg, width) for i in range(n_first)]
        _initialise_from_data(run, first)
        stream = itertools.chain(first, stream)
    return stream, resumed


def _heldout(sae: SAE, eval_batches: Iterable[torch.Tensor] | None) -> tuple[dict[str, Any] | None, torch.Tensor | None]:
    """Held-out metrics and per-latent density of the folded SAE (None without eval batches)."""
    if eval_batches is None:
        return None, None
    stats = reconstruction_stats(sae, eval_batches)
    return (stats.result() if stats.n else {"n_tokens": 0}), stats.density()


def train_sae(
    sae_cfg: SAEConfig,
    batches: BatchSource,
    train_cfg: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    eval_batches: Iterable[torch.Tensor] | None = None,
    ctx: DistContext | None = None,
    stop_after_steps: int | None = None,
) -> TrainResult:
    """Train one SAE on `batches` (global batches of `train_cfg.batch_size` tokens).

    With `out_dir` the run checkpoints into `out_dir/checkpoints/`, resumes from the latest
    valid checkpoint, and at the end saves the folded SAE in SAELens format
    (`saes.formats.saelens.save_saelens`) and `training.json` (configs, metrics history,
    final and held-out metrics, versions), then removes its checkpoints. Under a DDP
    context each rank trains on its slice of every batch. `eval_batches` (raw activations)
    give held-out metrics of the folded SAE. `stop_after_steps` ends the loop early
    (checkpointing first) without finishing, e.g. to test resumption.
    """
    cfg = train_cfg.resolve(sae_cfg.d_in, sae_cfg.d_sae)
    world = 1 if ctx is None else ctx.world_size
    if cfg.batch_size % world:
        raise InvalidInputError(
            f"batch_size {cfg.batch_size} must be divisible by the number of ranks ({world})"
        )
    device = cfg.device if ctx is None else ctx.device(cfg.device)
    torch.manual_seed(cfg.seed)
    run = _Run(sae_cfg, cfg, device, ctx)
    out = Path(out_dir) if out_dir is not None else None
    stream, resumed = _start(run, batches, out)
    last = cfg.total_steps if stop_after_steps is None else min(cfg.total_steps, stop_after_steps)
    loop = _Loop(run, out, last)
    bar = tqdm(
        total=cfg.total_steps, initial=run.step, disable=not (cfg.progress and loop.is_main),
        desc=f"train {sae_cfg.architecture} {sae_cfg.hook_name}".strip(), unit="step",
    )
    started = time.perf_counter()
    run.sae.train()
    while run.step < last:
        row = loop.step(_checked(next(stream, None), run.step, cfg, row_width(sae_cfg)))
        bar.update(1)
        bar.set_postfix(L0=f"{row['l0']:.1f}", FVU=f"{row['fvu']:.3f}")
        loop.log(row)
        loop.maybe_checkpoint()
    bar.close()
    folded = fold_input_scale(run.sae, run.scale, run.output_scale).eval()
    final = dict(run.history[-1]) if run.history else {}
    final.update(wall_seconds=time.perf_counter() - started, input_scale=run.scale)
    if sae_cfg.is_transcoder:
        final["output_scale"] = run.output_scale
    if run.step < cfg.total_steps:
        return TrainResult(folded, final, None, run.history, run.scale, cfg, resumed)
    heldout, density = _heldout(folded, eval_batches)
    record = {
        "status": "complete",
        "sae_config": sae_cfg.to_dict(),
        "train_config": cfg.to_dict(),
        "world_size": world,
        "input_scale": run.scale,
        "final_metrics": final,
        "heldout_metrics": heldout,
        "history": run.history,
        "created_with": created_with(),
    }
    if out is not None and loop.is_main:
        save_saelens(folded, out, sparsity=density)
        _write_record(out, record)
        remove_checkpoints(out)
    return TrainResult(folded, final, heldout, run.history, run.scale, cfg, resumed, record)
