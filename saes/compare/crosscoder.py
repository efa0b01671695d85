"""The engine layer of `crosscoder`; its other layers: `sae_atlas.api.operations.crosscoder`
(parameter), `sae_atlas.api.results.crosscoder` (typed-result),
`sae_atlas.api.services.crosscoder` (service).

Acausal crosscoders on paired activations of two models (or two layers, or two
checkpoints) at the same tokens, and each latent's relative decoder norm.

A crosscoder (Lindsey et al. 2024, "Sparse crosscoders for cross-layer features and model
diffing") reads both sides of a token and reconstructs both: `f = TopK(W_A x_A + W_B x_B + b)`,
`x_A' = f D_A + b_A`, `x_B' = f D_B + b_B`, one decoder per side. That is exactly an SAE over
the concatenated row `[x_A, x_B]` whose encoder and decoder split by side, so it trains as a
BatchTopK SAE (Bussmann et al. 2024; the BatchTopK crosscoder of Minder et al. 2025,
"Overcoming sparsity artifacts in crosscoders to interpret chat-tuning") on the project's
trainer and is saved in its SAELens layout (`crosscoders/<id>/` of atlas A) with a
`crosscoder.json` naming both sides. Two differences from Lindsey et al., stated: each side
is first scaled to `E||x_s||^2 = d_s` (estimated on the first `scale_batches` batches of the
seeded stream, so a resumed run rescales identically) so neither side dominates the loss;
and the trainer keeps each concatenated decoder row at unit norm (the top-k ranks `f_j` by
the joint row norm, not the sum of the per-side norms).

The relative decoder norm of latent `j` is `r_j = ||D_B[j]|| / (||D_A[j]|| + ||D_B[j]||)`
(Lindsey et al.): about 0.5 for a latent both sides use alike, near 0 for an A-only latent
and near 1 for a B-only latent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.loop import train_dictionaries
from sae_atlas.saes.train.sources import Batch, RowSource
from sae_atlas.saes.train.trainer import SAEDictionary, TrainResult
from sae_atlas.store.atomic import atomic_write_json, read_json
from sae_atlas.store.layout import AtlasLayout, check_id

CROSSCODER_FILE = "crosscoder.json"
LatentClass = Literal["a_only", "shared", "b_only"]
A_ONLY_BELOW = 0.1
B_ONLY_ABOVE = 0.9
PairedStream = Callable[[int], Iterator[torch.Tensor]]  # skip -> batches [B, d_a + d_b]


@dataclass(frozen=True)
class SideScales:
    """Per-side divisors applied before the crosscoder sees a row (`E||x_s / s||^2 = d_s`)."""

    d_a: int
    scale_a: float
    scale_b: float

    def apply(self, rows_BD: torch.Tensor) -> torch.Tensor:
        """Rows `[B, d_a + d_b]` with each side divided by its scale."""
        return torch.cat([rows_BD[:, : self.d_a] / self.scale_a, rows_BD[:, self.d_a :] / self.scale_b], dim=1)


def side_scales(first_batches: list[torch.Tensor], d_a: int) -> SideScales:
    """The scales making each side's mean squared norm its width, from a few batches."""
    rows = torch.cat(first_batches).double()
    if rows.shape[1] <= d_a:
        raise InvalidInputError(f"paired rows of width {rows.shape[1]} leave no side B after d_a={d_a}")
    a, b = rows[:, :d_a], rows[:, d_a:]
    ms_a, ms_b = float((a**2).sum(1).mean()), float((b**2).sum(1).mean())
    if ms_a <= 0 or ms_b <= 0:
        raise InvalidInputError("one side's activations are all zero; nothing to crosscode")
    return SideScales(d_a, (ms_a / d_a) ** 0.5, (ms_b / b.shape[1]) ** 0.5)


def crosscoder_dir(root: str | Path, cc_id: str) -> Path:
    """Where crosscoder `cc_id` of the atlas lives: `crosscoders/<id>/`."""
    return AtlasLayout(root).root / "crosscoders" / check_id(cc_id, "crosscoder id")


def default_crosscoder_id(hook_a: str, hook_b: str, d_sae: int) -> str:
    """A crosscoder's id when none is given: `<hook_a>--<hook_b>-<d_sae>`."""
    return check_id(f"{hook_a}--{hook_b}-{d_sae}", "crosscoder id")


def write_crosscoder_sides(out: Path, d_a: int, d_b: int, scales: SideScales, sides: dict[str, Any]) -> None:
    """The `crosscoder.json` of a crosscoder saved in `out`: its sides' widths and scales and
    what A and B are (`sides`)."""
    atomic_write_json(out / CROSSCODER_FILE, {"d_a": d_a, "d_b": d_b, "scale_a": scales.scale_a,
                                              "scale_b": scales.scale_b, "sides": sides})


def crosscoder_config(d_a: int, d_b: int, d_sae: int, k: int, *, hook_name: str = "", model_name: str = "") -> SAEConfig:
    """The BatchTopK SAE config of a crosscoder over rows `[x_A (d_a), x_B (d_b)]`."""
    return SAEConfig(architecture="batchtopk", d_in=d_a + d_b, d_sae=d_sae, k=k, hook_name=hook_name,
                     model_name=model_name)


class CrosscoderDictionary(SAEDictionary):
    """A crosscoder in the loop: reads `hook_a` and `hook_b` (same tokens), scales each side
    (`SideScales`, from the first `side_batches` batches) and trains as an SAE on the joined
    rows `[x_A, x_B]`."""

    def __init__(self, cfg: SAEConfig, train: TrainConfig, device: str = "cpu", *, hook_a: str, hook_b: str,
                 d_a: int, side_batches: int = 8, name: str | None = None) -> None:
        super().__init__(cfg, train, device, name=name or f"crosscoder-{hook_a}-{hook_b}", hook=hook_a)
        self.hooks, self.hook_b, self.d_a, self.side_batches = (hook_a, hook_b), hook_b, d_a, side_batches
        self.sides = SideScales(d_a, 1.0, 1.0)

    def _joined(self, batch: Batch) -> torch.Tensor:
        return torch.cat([batch[self.hook], batch[self.hook_b]], dim=1)

    def _input(self, batch: Batch) -> torch.Tensor:
        return self.sides.apply(self._joined(batch))

    def first_batches(self) -> int:
        return max(self.side_batches, super().first_batches())

    def initialise(self, first: list[Batch]) -> None:
        self.sides = side_scales([self._joined(b) for b in first[: self.side_batches]], self.d_a)
        super().initialise(first[: super().first_batches()])

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "sides": dataclasses.asdict(self.sides)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self.sides = SideScales(**state["sides"])


def train_crosscoder(paired: PairedStream, d_a: int, d_b: int, *, d_sae: int, k: int, train_cfg: TrainConfig,
                     out_dir: str | Path | None = None, sides: dict[str, Any] | None = None,
                     scale_batches: int = 8) -> tuple[TrainResult, SideScales]:
    """Train a crosscoder on `paired(skip)` batches `[B, d_a + d_b]` (each side scaled first,
    `SideScales`); with `out_dir` it is saved (resumable) with a `crosscoder.json` recording
    `sides` (what A and B are) and the scales."""
    cfg = crosscoder_config(d_a, d_b, d_sae, k, hook_name=str((sides or {}).get("hook_a", "")),
                            model_name=str((sides or {}).get("model_a", "")))
    train = train_cfg.resolve(cfg.d_in, cfg.d_sae)
    torch.manual_seed(train.seed)
    coder = CrosscoderDictionary(cfg, train, train.device, hook_a="a", hook_b="b", d_a=d_a, side_batches=scale_batches)
    source = RowSource(paired, lambda rows: {"a": rows[:, :d_a], "b": rows[:, d_a:]}, ("a", "b"),
                       (train.batch_size, d_a + d_b), needed=f"{train.total_steps} batches of {train.batch_size} tokens")
    out = Path(out_dir) if out_dir is not None else None
    run = train_dictionaries([coder], source, checkpoint_dir=out, desc=f"train crosscoder {cfg.hook_name}".strip())
    result = coder.finish(out, None, wall_seconds=run.wall_seconds, resumed_from_step=run.resumed_from_step)
    scales = coder.sides
    if out is not None:
        write_crosscoder_sides(out, d_a, d_b, scales, sides or {})
    return result, scales


def read_crosscoder_sides(folder: str | Path) -> dict[str, Any]:
    """The `crosscoder.json` of a saved crosscoder (IntegrityError naming it when damaged)."""
    return read_json(Path(folder) / CROSSCODER_FILE, "train the crosscoder again (`sae-atlas train-crosscoder`)")


@dataclass(frozen=True)
class RelativeNorms:
    """Per latent: each side's decoder norm, the relative norm and its class."""

    norm_a: np.ndarray  # [F]
    norm_b: np.ndarray  # [F]
    relative: np.ndarray  # [F] ||D_B|| / (||D_A|| + ||D_B||)
    latent_class: np.ndarray  # [F] "a_only" (< 0.1), "shared" or "b_only" (> 0.9)


def relative_norms(sae: SAE, d_a: int) -> RelativeNorms:
    """The relative decoder norms of a crosscoder whose rows put side A's `d_a` dims first."""
    W = sae.W_dec.detach().double().cpu()
    if not 0 < d_a < W.shape[1]:
        raise InvalidInputError(f"d_a={d_a} must split the decoder rows of width {W.shape[1]} into two sides")
    na, nb = W[:, :d_a].norm(dim=1).numpy(), W[:, d_a:].norm(dim=1).numpy()
    total = na + nb
    rel = np.where(total > 0, nb / np.where(total > 0, total, 1.0), 0.5)
    cls = np.where(rel < A_ONLY_BELOW, "a_only", np.where(rel > B_ONLY_ABOVE, "b_only", "shared"))
    return RelativeNorms(na, nb, rel, cls)


def paired_batches(pairs: Iterator[torch.Tensor], batch_size: int, *, seed: int = 0,
                   buffer_batches: int = 16) -> Iterator[torch.Tensor]:
    """Fixed-size batches `[batch_size, d]` of rows arriving in chunks of any size, shuffled
    within a buffer of `buffer_batches` batches (seeded: the same input gives the same batches)."""
    gen = torch.Generator().manual_seed(seed)
    buffer: list[torch.Tensor] = []
    held = 0
    for rows in pairs:
        buffer.append(rows.float().cpu())
        held += len(rows)
        if held >= batch_size * buffer_batches:
            pool = torch.cat(buffer)
            pool = pool[torch.randperm(len(pool), generator=gen)]
            n_out = len(pool) // batch_size
            yield from pool[: n_out * batch_size].split(batch_size)
            buffer, held = [pool[n_out * batch_size :]], len(pool) - n_out * batch_size
    pool = torch.cat(buffer) if buffer else torch.zeros(0)
    if len(pool) >= batch_size:
        pool = pool[torch.randperm(len(pool), generator=gen)]
        yield from pool[: (len(pool) // batch_size) * batch_size].split(batch_size)
