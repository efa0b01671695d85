"""Train a cross-layer transcoder on rows of every MLP's input and output, resumably.

The loop is the SAE trainer's (`saes.train.trainer`): Adam with its warm-up / decay
schedule, gradient clipping, unit-norm decoders (each feature's whole decoder
`W_dec[l][i] [L - l, d]`, its gradient's component along it removed before the step), the
same atomic checkpoints and config check on resume (a killed run resumes from its latest
checkpoint with the data stream continued, so the same seed gives the same weights). The
loss is the CLT's (`CrossLayerTranscoder.training_loss`: the squared error of every MLP
output summed over layers plus the JumpReLU L0 penalty, or the FVU under TopK).

Each layer's input and output get their own scale (`E||s_l x_l||^2 = d`, estimated on the
first `scale_batches` batches), folded into the saved weights (`fold_layer_scales`);
`b_dec` starts at the mean scaled output of each layer. Under torchrun every rank reads the
same global batches and trains on its slice (`DistributedDataParallel` averages the
gradients), which equals single-process training on the global batches.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from sae_atlas.saes.distributed import DistContext, all_reduce_
from sae_atlas.saes.sae.losses import StepInfo
from sae_atlas.saes.train.checkpoint import (
    load_latest_checkpoint,
    remove_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.distributed import rank_slice
from sae_atlas.saes.train.schedule import make_scheduler
from sae_atlas.saes.train.trainer import (
    check_same_config,
    loss_module,
    make_optimizer,
    summarise_window,
)
from sae_atlas.saes.transcoders.clt import (
    CLTConfig,
    CrossLayerTranscoder,
    build_clt,
    fold_layer_scales,
)
from sae_atlas.saes.transcoders.clt_data import clt_metrics
from sae_atlas.saes.transcoders.clt_store import save_clt
from sae_atlas.store.atomic import atomic_write_json
from sae_atlas.store.errors import InvalidInputError
from sae_atlas.store.layout import created_with

CLTBatches = Callable[[int], Iterator[torch.Tensor]]  # skip -> batches [B, 2, L, d]
TRAINING_FILE = "training.json"


@dataclass
class CLTTrainResult:
    """A finished (or stopped) run: the CLT on raw activations (eval mode) and its metrics."""

    clt: CrossLayerTranscoder
    final_metrics: dict[str, float]
    heldout_metrics: dict[str, Any] | None
    history: list[dict[str, float]]
    resumed_from_step: int | None
    record: dict[str, Any]


@torch.no_grad()
def init_clt(clt: CrossLayerTranscoder, generator: torch.Generator) -> None:
    """Random encoders with unit-norm columns, random unit-norm feature decoders, zero biases."""
    W_enc = torch.randn(clt.W_enc.shape, generator=generator)
    clt.W_enc.copy_(W_enc / W_enc.norm(dim=1, keepdim=True))
    for w in clt.W_dec:
        w.copy_(torch.randn(w.shape, generator=generator))
    normalise_decoders(clt)
    clt.b_enc.zero_()
    clt.b_dec.zero_()


@torch.no_grad()
def normalise_decoders(clt: CrossLayerTranscoder) -> None:
    """Rescale every feature's whole decoder `W_dec[l][i]` to unit norm."""
    for w in clt.W_dec:
        w.div_(w.pow(2).sum((1, 2), keepdim=True).sqrt().clamp_min(1e-12))


@torch.no_grad()
def project_decoder_grads(clt: CrossLayerTranscoder) -> None:
    """Remove from each feature decoder's gradient its component along the (unit) decoder."""
    for w in clt.W_dec:
        if w.grad is not None:
            w.grad.sub_((w.grad * w).sum((1, 2), keepdim=True) * w)


class _Run:
    """Everything a checkpoint holds."""

    def __init__(self, cfg: CLTConfig, train: TrainConfig, device: str, ctx: DistContext | None) -> None:
        self.cfg, self.train, self.device, self.ctx = cfg, train, device, ctx
        self.clt = build_clt(cfg)
        init_clt(self.clt, torch.Generator().manual_seed(cfg.seed))
        self.clt.to(device)
        model = loss_module(self.clt)  # type: ignore[arg-type]  # the same training_loss signature
        self.model = nn.parallel.DistributedDataParallel(model) if ctx is not None and ctx.world_size > 1 else model
        self.optimizer = make_optimizer(self.clt, train)  # type: ignore[arg-type]
        self.scheduler = make_scheduler(self.optimizer, train.total_steps, train.lr_warmup_steps,
                                        train.lr_decay_fraction)
        self.step, self.tokens_seen = 0, 0
        self.scale_in = torch.ones(cfg.n_layers, dtype=torch.float64)
        self.scale_out = torch.ones(cfg.n_layers, dtype=torch.float64)
        self.data_variance: float | None = None
        self.history: list[dict[str, float]] = []
        self.log_window: list[dict[str, float]] = []

    def state(self) -> dict[str, Any]:
        return {"sae_config": self.cfg.to_dict(), "train_config": self.train.to_dict(),
                "model": self.clt.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": rng_state(), "step": self.step,
                "tokens_seen": self.tokens_seen, "scale_in": self.scale_in, "scale_out": self.scale_out,
                "data_variance": self.data_variance, "history": self.history, "log_window": self.log_window}

    def load(self, state: dict[str, Any]) -> None:
        check_same_config(state, self.cfg, self.train)
        self.clt.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.scale_in, self.scale_out = state["scale_in"], state["scale_out"]
        self.data_variance, self.history, self.log_window = state["data_variance"], state["history"], state["log_window"]

    @torch.no_grad()
    def initialise(self, first: list[torch.Tensor]) -> None:
        """Per-layer scales, the target variance and `b_dec` from the first batches."""
        rows = torch.cat(first).double()
        d = self.cfg.d_model
        if self.train.normalize_inputs:
            self.scale_in = (d / rows[:, 0].pow(2).sum(-1).mean(0).clamp_min(1e-12)).sqrt()
            self.scale_out = (d / rows[:, 1].pow(2).sum(-1).mean(0).clamp_min(1e-12)).sqrt()
        y = rows[:, 1] * self.scale_out[:, None]
        self.data_variance = float((y - y.mean(0)).pow(2).sum((1, 2)).mean())
        self.clt.b_dec.copy_(y.mean(0))

    def step_on(self, batch: torch.Tensor) -> dict[str, float]:
        """One optimizer step on this rank's slice of a global batch."""
        batch = rank_slice(batch, self.ctx).to(self.device, torch.float32)
        x = batch[:, 0] * self.scale_in.to(batch)[:, None]
        y = batch[:, 1] * self.scale_out.to(batch)[:, None]
        info = StepInfo(step=self.step, total_steps=self.train.total_steps, data_variance=self.data_variance)
        loss, metrics, _ = self.model(x, info, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        project_decoder_grads(self.clt)
        if self.train.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.clt.parameters(), self.train.grad_clip)
        self.optimizer.step()
        normalise_decoders(self.clt)
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += self.train.batch_size
        return {**{k: float(v) for k, v in metrics.items()}, "loss": float(loss.detach())}

    def log(self, row: dict[str, float]) -> None:
        """Every `log_every_steps` (and at the end) append the window's means, averaged over ranks."""
        self.log_window.append(row)
        if self.step % self.train.log_every_steps and self.step != self.train.total_steps:
            return
        summary = summarise_window(self.log_window)
        means = all_reduce_(torch.tensor(list(summary.values()), dtype=torch.float64), self.ctx, "mean")
        self.history.append({**dict(zip(summary, means.tolist(), strict=True)), "step": self.step,
                             "tokens": self.tokens_seen, "lr": self.scheduler.get_last_lr()[0]})
        self.log_window = []


def _checked(batch: torch.Tensor | None, step: int, train: TrainConfig, cfg: CLTConfig) -> torch.Tensor:
    if batch is None:
        raise InvalidInputError(f"the batch source ran out after {step} batches; the run needs {train.total_steps} "
                                f"batches of {train.batch_size} tokens")
    want = (train.batch_size, 2, cfg.n_layers, cfg.d_model)
    if tuple(batch.shape) != want:
        raise InvalidInputError(f"expected batches of shape {want}, got {tuple(batch.shape)}")
    return batch


def train_clt(
    cfg: CLTConfig,
    batches: CLTBatches,
    train_cfg: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    eval_rows: torch.Tensor | None = None,
    stop_after_steps: int | None = None,
    ctx: DistContext | None = None,
) -> CLTTrainResult:
    """Train a CLT on `batches(skip)` (`[B, 2, L, d]`, the stream after `skip` batches).
    With `out_dir` the run checkpoints, resumes, and at the end saves the folded CLT
    (`saes.transcoders.clt_store.save_clt`) and `training.json`, then removes its
    checkpoints. `eval_rows [n, 2, L, d]` give held-out metrics (`clt_metrics`);
    `stop_after_steps` ends early (checkpointing first) without finishing. Under a DDP
    context each rank trains on its slice of every batch; only rank 0 writes files."""
    train = train_cfg.resolve(cfg.d_model, cfg.d_sae)
    world = 1 if ctx is None else ctx.world_size
    if train.batch_size % world:
        raise InvalidInputError(f"batch_size {train.batch_size} must be divisible by the number of ranks ({world})")
    torch.manual_seed(train.seed)
    run = _Run(cfg, train, train.device if ctx is None else ctx.device(train.device), ctx)
    main = ctx is None or ctx.is_main
    out = Path(out_dir) if out_dir is not None else None
    resumed = None
    if out is not None and (state := load_latest_checkpoint(out, map_location=train.device)) is not None:
        run.load(state)
        resumed = run.step
    stream = iter(batches(run.step))
    if resumed is None:
        first = [_checked(next(stream, None), i, train, cfg) for i in range(min(train.scale_batches, train.total_steps))]
        run.initialise(first)
        stream = itertools.chain(first, stream)
    last = train.total_steps if stop_after_steps is None else min(train.total_steps, stop_after_steps)
    every = train.checkpoint_every_tokens
    bar = tqdm(total=train.total_steps, initial=run.step, disable=not (train.progress and main), unit="step",
               desc=f"train CLT {cfg.architecture} x{cfg.n_layers} layers")
    started = time.perf_counter()
    run.clt.train()
    while run.step < last:
        row = run.step_on(_checked(next(stream, None), run.step, train, cfg))
        bar.update(1)
        bar.set_postfix(L0=f"{row['l0']:.1f}", FVU=f"{row['fvu']:.3f}")
        run.log(row)
        crossed = every and run.tokens_seen // every > (run.tokens_seen - train.batch_size) // every
        if out is not None and main and run.step < train.total_steps and (crossed or run.step == last):
            save_checkpoint(out, run.step, run.state())
    bar.close()
    folded = fold_layer_scales(run.clt, run.scale_in, run.scale_out).eval()
    final = {**(run.history[-1] if run.history else {}), "wall_seconds": time.perf_counter() - started}
    if run.step < train.total_steps:
        return CLTTrainResult(folded, final, None, run.history, resumed, {})
    heldout = clt_metrics(folded, eval_rows) if eval_rows is not None else None
    record = {"status": "complete", "clt_config": cfg.to_dict(), "train_config": train.to_dict(), "world_size": world,
              "scale_in": run.scale_in.tolist(), "scale_out": run.scale_out.tolist(), "final_metrics": final,
              "heldout_metrics": heldout, "history": run.history, "created_with": created_with()}
    if out is not None and main:
        save_clt(folded, out)
        atomic_write_json(out / TRAINING_FILE, record)
        remove_checkpoints(out)
    return CLTTrainResult(folded, final, heldout, run.history, resumed, record)
