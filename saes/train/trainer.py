"""SAEs and transcoders as dictionaries of the training loop, and `train_sae` for one.

An SAE trains with Adam under the warm-up/decay schedule and gradient clipping
(`saes.train.dictionary`), keeps decoder rows at unit norm (the gradient component
parallel to each row is removed before the step and rows are renormalised after),
initialises `b_dec` at the geometric median of the first batch, scales inputs by one
scalar so `E||x||^2 = d_in` (estimated on the first batches, folded into the weights of
the returned SAE) and tracks dead latents in tokens for AuxK. `train_sae` runs the loop
(`saes.train.loop`) over one SAE with atomic checkpoints, so a killed run resumes from the
latest valid checkpoint with the data stream continued exactly (same seed: same weights).

A transcoder reads its input hook and predicts its output hook (paired rows
`[B, d_in + d_out]` for `train_sae`, `saes.train.paired_rows`); the target is scaled by
its own scalar (`E||y||^2 = d_out`); `b_dec` (its output bias) starts at the geometric
median of the targets and the FVU is measured against the targets' variance.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.distributed import DistContext, all_reduce_
from sae_atlas.saes.formats.saelens import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.sae.losses import StepInfo
from sae_atlas.saes.train import dictionary
from sae_atlas.saes.train.checkpoint import remove_checkpoints
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.dictionary import Batch, Dictionary, loss_module, make_optimizer
from sae_atlas.saes.train.geometric_median import geometric_median
from sae_atlas.saes.train.loop import train_dictionaries
from sae_atlas.saes.train.paired_rows import row_width
from sae_atlas.saes.train.reconstruction import reconstruction_stats
from sae_atlas.saes.train.scaling import fold_input_scale, input_scale
from sae_atlas.saes.train.sources import RowSource, RowStream
from sae_atlas.store.atomic import atomic_write_json
from sae_atlas.store.layout import created_with

BatchSource = RowStream  # the rows `train_sae` takes ([B, d_in], or [B, d_in + d_out] for a transcoder)
__all__ = ["BatchSource", "SAEDictionary", "TrainResult", "loss_module", "make_optimizer", "optimizer_step",
           "train_sae"]


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
    """One SAE training step (`saes.train.dictionary.optimizer_step` with unit-norm decoder rows)."""
    return dictionary.optimizer_step(model, sae, optimizer, x, info, grad_clip, target,
                                     lambda: project_decoder_grad(sae), lambda: normalise_decoder(sae))


def _write_record(out_dir: Path, record: dict[str, Any]) -> None:
    atomic_write_json(Path(out_dir) / "training.json", record)


def _heldout(sae: SAE, eval_batches: Iterable[torch.Tensor] | None) -> tuple[dict[str, Any] | None, torch.Tensor | None]:
    """Held-out metrics and per-latent density of the folded SAE (None without eval batches)."""
    if eval_batches is None:
        return None, None
    stats = reconstruction_stats(sae, eval_batches)
    return (stats.result() if stats.n else {"n_tokens": 0}), stats.density()


class SAEDictionary(Dictionary):
    """An SAE (or transcoder) in the loop: reads `hook` (and a transcoder's `hook_out`,
    default the config's hook names) from each batch; `train` must be resolved for it."""

    def __init__(self, sae_cfg: SAEConfig, train: TrainConfig, device: str = "cpu", *, name: str | None = None,
                 hook: str | None = None, hook_out: str | None = None) -> None:
        sae = build_sae(sae_cfg).to(device)
        normalise_decoder(sae)
        self.hook = sae_cfg.hook_name if hook is None else hook
        self.hook_out = sae_cfg.hook_name_out if hook_out is None else hook_out
        hooks = (self.hook, self.hook_out) if sae_cfg.is_transcoder else (self.hook,)
        super().__init__(name or "-".join(hooks), hooks, sae, sae_cfg, train, device)
        self.sae, self.cfg = sae, sae_cfg
        self.since_fired = torch.zeros(sae_cfg.d_sae, dtype=torch.int64, device=device)
        self.scale = 1.0
        self.output_scale = 1.0  # a transcoder's target scale (an SAE's is `scale`)

    def _input(self, batch: Batch) -> torch.Tensor:
        """The unscaled input rows of a batch (a crosscoder joins its two hooks here)."""
        return batch[self.hook]

    def _target(self, batch: Batch) -> torch.Tensor:
        return batch[self.hook_out] if self.cfg.is_transcoder else self._input(batch)

    @torch.no_grad()
    def initialise(self, first: list[Batch]) -> None:
        """Input (and a transcoder's target) scale and the target variance from the first
        global batches; `b_dec` from the first batch's targets."""
        x = torch.cat([self._input(b) for b in first]).to(self.device, torch.float64)
        y = torch.cat([self._target(b) for b in first]).to(self.device, torch.float64)
        if self.train.normalize_inputs:
            self.scale = input_scale(float(x.pow(2).sum()), x.shape[0], self.cfg.d_in)
            self.output_scale = (input_scale(float(y.pow(2).sum()), y.shape[0], self.cfg.output_dim)
                                 if self.cfg.is_transcoder else self.scale)
        scaled = y * self.output_scale
        self.data_variance = float((scaled - scaled.mean(0)).pow(2).sum(-1).mean())
        first_targets = self._target(first[0]).to(self.device, torch.float64) * self.output_scale
        if self.train.b_dec_init == "geometric_median":
            self.sae.b_dec.copy_(geometric_median(first_targets))
        elif self.train.b_dec_init == "mean":
            self.sae.b_dec.copy_(first_targets.mean(0))

    def inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self._input(batch).to(self.device, torch.float32) * self.scale
        if not self.cfg.is_transcoder:
            return x, None
        return x, batch[self.hook_out].to(self.device, torch.float32) * self.output_scale

    def step_info(self) -> StepInfo:
        cfg = self.train
        return StepInfo(step=self.step, total_steps=cfg.total_steps, dead_mask=self.since_fired >= cfg.dead_window_tokens,
                        k_aux=cfg.k_aux, aux_coefficient=cfg.aux_coefficient, data_variance=self.data_variance)

    def project_decoder_grad(self) -> None:
        project_decoder_grad(self.sae)  # the module function, looked up per call (named kill points patch it)

    def normalise_decoder(self) -> None:
        normalise_decoder(self.sae)

    @torch.no_grad()
    def after_step(self, fired: torch.Tensor) -> None:
        """Dead-latent counters in tokens, from the firing counts of every rank's rows."""
        all_reduce_(fired, self.ctx)
        self.since_fired.add_(self.train.batch_size).masked_fill_(fired > 0, 0)

    def log_extra(self) -> dict[str, float]:
        return {"dead_fraction": float((self.since_fired >= self.train.dead_window_tokens).float().mean())}

    def extra_state(self) -> dict[str, Any]:
        return {"since_fired": self.since_fired.cpu(), "input_scale": self.scale, "output_scale": self.output_scale}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.since_fired = state["since_fired"].to(self.device)
        self.scale, self.output_scale = state["input_scale"], state["output_scale"]

    def finish(self, out_dir: Path | None, eval_batches: Iterable[torch.Tensor] | None, *, wall_seconds: float,
               world_size: int = 1, write: bool = True, resumed_from_step: int | None = None) -> TrainResult:
        """The SAE folded to raw activations with its metrics; when its last step is done and
        `out_dir` is given (and `write`: the rank that writes), saved in SAELens format
        with `training.json`, its own checkpoints removed. `eval_batches` are raw rows
        (paired for a transcoder) for held-out metrics."""
        folded = fold_input_scale(self.sae, self.scale, self.output_scale).eval()
        final = dict(self.history[-1]) if self.history else {}
        final.update(wall_seconds=wall_seconds, input_scale=self.scale)
        if self.cfg.is_transcoder:
            final["output_scale"] = self.output_scale
        if self.step < self.train.total_steps:
            return TrainResult(folded, final, None, self.history, self.scale, self.train, resumed_from_step)
        heldout, density = _heldout(folded, eval_batches)
        record = {
            "status": "complete",
            "sae_config": self.cfg.to_dict(),
            "train_config": self.train.to_dict(),
            "world_size": world_size,
            "input_scale": self.scale,
            "final_metrics": final,
            "heldout_metrics": heldout,
            "history": self.history,
            "created_with": created_with(),
        }
        if out_dir is not None and write:
            save_saelens(folded, out_dir, sparsity=density)
            _write_record(out_dir, record)
            remove_checkpoints(out_dir)
        return TrainResult(folded, final, heldout, self.history, self.scale, self.train, resumed_from_step, record)


def split_rows(cfg: SAEConfig, hook: str = "x", hook_out: str = "y") -> tuple[tuple[str, ...], Any]:
    """The hooks and the split of an SAE's rows (`[B, d_in]`, a transcoder's `[B, d_in + d_out]`)."""
    if not cfg.is_transcoder:
        return (hook,), lambda rows: {hook: rows}
    return (hook, hook_out), lambda rows: {hook: rows[..., : cfg.d_in], hook_out: rows[..., cfg.d_in :]}


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
        raise InvalidInputError(f"batch_size {cfg.batch_size} must be divisible by the number of ranks ({world})")
    device = cfg.device if ctx is None else ctx.device(cfg.device)
    torch.manual_seed(cfg.seed)
    hooks, split = split_rows(sae_cfg)
    sae = SAEDictionary(sae_cfg, cfg, device, name="sae", hook=hooks[0], hook_out=hooks[-1])
    source = RowSource(batches, split, hooks, (cfg.batch_size, row_width(sae_cfg)), ctx,
                       needed=f"{cfg.total_steps} batches of {cfg.batch_size} tokens")
    out = Path(out_dir) if out_dir is not None else None
    run = train_dictionaries([sae], source, checkpoint_dir=out, ctx=ctx, stop_after_steps=stop_after_steps,
                             desc=f"train {sae_cfg.architecture} {sae_cfg.hook_name}".strip())
    return sae.finish(out, eval_batches, wall_seconds=run.wall_seconds, world_size=world,
                      write=ctx is None or ctx.is_main, resumed_from_step=run.resumed_from_step)
