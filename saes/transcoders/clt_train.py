"""Train a cross-layer transcoder on rows of every MLP's input and output, resumably.

A CLT is a dictionary of the one training loop (`saes.train.loop`, `CLTDictionary`): Adam
with its warm-up / decay schedule, gradient clipping, unit-norm decoders (each feature's
whole decoder `W_dec[l][i] [L - l, d]`, its gradient's component along it removed before
the step), the same atomic checkpoints and config check on resume (a killed run resumes
from its latest checkpoint with the data stream continued, so the same seed gives the same
weights). It reads the batch keys `blocks.l.<input_site>` and `blocks.l.<output_site>`
(`CLTConfig.hooks_in`, `hooks_out`). The loss is the CLT's (`CrossLayerTranscoder.training_loss`: the squared error of every MLP
output summed over layers plus the JumpReLU L0 penalty, or the FVU under TopK).

Each layer's input and output get their own scale (`E||s_l x_l||^2 = d`, estimated on the
first `scale_batches` batches), folded into the saved weights (`fold_layer_scales`);
`b_dec` starts at the mean scaled output of each layer. Under torchrun every rank reads the
same global batches and trains on its slice (`DistributedDataParallel` averages the
gradients), which equals single-process training on the global batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.sae.losses import StepInfo
from sae_atlas.saes.train.checkpoint import remove_checkpoints
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.dictionary import Dictionary
from sae_atlas.saes.train.loop import train_dictionaries
from sae_atlas.saes.train.sources import Batch, RowSource
from sae_atlas.saes.transcoders.clt import (
    CLTConfig,
    CrossLayerTranscoder,
    build_clt,
    fold_layer_scales,
)
from sae_atlas.saes.transcoders.clt_data import clt_metrics
from sae_atlas.saes.transcoders.clt_store import save_clt
from sae_atlas.store.atomic import atomic_write_json
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


class CLTDictionary(Dictionary):
    """A CLT in the loop (`train` resolved for it); per-layer input and output scales."""

    def __init__(self, cfg: CLTConfig, train: TrainConfig, device: str = "cpu", *, name: str | None = None) -> None:
        clt = build_clt(cfg)
        init_clt(clt, torch.Generator().manual_seed(cfg.seed))
        clt.to(device)
        super().__init__(name or f"clt-{cfg.input_site}", (*cfg.hooks_in, *cfg.hooks_out), clt, cfg, train, device)
        self.clt, self.cfg = clt, cfg
        self.scale_in = torch.ones(cfg.n_layers, dtype=torch.float64)
        self.scale_out = torch.ones(cfg.n_layers, dtype=torch.float64)

    def _rows(self, batch: Batch, hooks: list[str]) -> torch.Tensor:
        return torch.stack([batch[h] for h in hooks], dim=1)  # [B, L, d]

    @torch.no_grad()
    def initialise(self, first: list[Batch]) -> None:
        """Per-layer scales, the target variance and `b_dec` from the first batches."""
        x = torch.cat([self._rows(b, self.cfg.hooks_in) for b in first]).double()
        y = torch.cat([self._rows(b, self.cfg.hooks_out) for b in first]).double()
        d = self.cfg.d_model
        if self.train.normalize_inputs:
            self.scale_in = (d / x.pow(2).sum(-1).mean(0).clamp_min(1e-12)).sqrt()
            self.scale_out = (d / y.pow(2).sum(-1).mean(0).clamp_min(1e-12)).sqrt()
        y = y * self.scale_out[:, None]
        self.data_variance = float((y - y.mean(0)).pow(2).sum((1, 2)).mean())
        self.clt.b_dec.copy_(y.mean(0))

    def inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self._rows(batch, self.cfg.hooks_in).to(self.device, torch.float32)
        y = self._rows(batch, self.cfg.hooks_out).to(self.device, torch.float32)
        return x * self.scale_in.to(x)[:, None], y * self.scale_out.to(y)[:, None]

    def step_info(self) -> StepInfo:
        return StepInfo(step=self.step, total_steps=self.train.total_steps, data_variance=self.data_variance)

    def project_decoder_grad(self) -> None:
        project_decoder_grads(self.clt)

    def normalise_decoder(self) -> None:
        normalise_decoders(self.clt)

    def extra_state(self) -> dict[str, Any]:
        return {"scale_in": self.scale_in, "scale_out": self.scale_out}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.scale_in, self.scale_out = state["scale_in"], state["scale_out"]

    def finish(self, out_dir: Path | None, eval_rows: torch.Tensor | None, *, wall_seconds: float,
               world_size: int = 1, write: bool = True, resumed_from_step: int | None = None) -> CLTTrainResult:
        """The CLT folded to raw activations with its metrics; when its last step is done and
        `out_dir` is given (and `write`), saved with `training.json`, its checkpoints removed.
        `eval_rows [n, 2, L, d]` give held-out metrics (`clt_metrics`)."""
        folded = fold_layer_scales(self.clt, self.scale_in, self.scale_out).eval()
        final = {**(self.history[-1] if self.history else {}), "wall_seconds": wall_seconds}
        if self.step < self.train.total_steps:
            return CLTTrainResult(folded, final, None, self.history, resumed_from_step, {})
        heldout = clt_metrics(folded, eval_rows) if eval_rows is not None else None
        record = {"status": "complete", "clt_config": self.cfg.to_dict(), "train_config": self.train.to_dict(),
                  "world_size": world_size, "scale_in": self.scale_in.tolist(), "scale_out": self.scale_out.tolist(),
                  "final_metrics": final, "heldout_metrics": heldout, "history": self.history,
                  "created_with": created_with()}
        if out_dir is not None and write:
            save_clt(folded, out_dir)
            atomic_write_json(out_dir / TRAINING_FILE, record)
            remove_checkpoints(out_dir)
        return CLTTrainResult(folded, final, heldout, self.history, resumed_from_step, record)


def split_clt_rows(cfg: CLTConfig) -> Callable[[torch.Tensor], Batch]:
    """Rows `[B, 2, L, d]` as the batch of a CLT's hooks."""
    def split(rows: torch.Tensor) -> Batch:
        return {**{h: rows[:, 0, layer] for layer, h in enumerate(cfg.hooks_in)},
                **{h: rows[:, 1, layer] for layer, h in enumerate(cfg.hooks_out)}}
    return split


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
    clt = CLTDictionary(cfg, train, train.device if ctx is None else ctx.device(train.device))
    source = RowSource(batches, split_clt_rows(cfg), clt.hooks, (train.batch_size, 2, cfg.n_layers, cfg.d_model),
                       ctx, needed=f"{train.total_steps} batches of {train.batch_size} tokens")
    out = Path(out_dir) if out_dir is not None else None
    run = train_dictionaries([clt], source, checkpoint_dir=out, ctx=ctx, stop_after_steps=stop_after_steps,
                             desc=f"train CLT {cfg.architecture} x{cfg.n_layers} layers")
    return clt.finish(out, eval_rows, wall_seconds=run.wall_seconds, world_size=world,
                      write=ctx is None or ctx.is_main, resumed_from_step=run.resumed_from_step)
