"""Lenses: read each layer's residual stream as a next-token distribution.

- Logit lens: the model's final norm and unembedding applied to the layer's residual.
- Tuned lens (after Belrose et al. 2023, "Eliciting Latent Predictions from Transformers
  with the Tuned Lens"): an affine map per layer sends the layer's residual to a prediction
  of the final layer's residual, then the logit lens reads it. Here the map is the ridge
  least-squares fit to the final residual (not the paper's KL-trained translator), so it is
  fitted from streamed sums `sum z z^T`, `sum z y^T` (`z = [h, 1]`) that merge exactly
  across ranks; its fitting loss is the fraction of the final residual's variance left
  unexplained on the fitting split.

`LensScores` scores lens logits against the model's own output on held-out tokens, per
layer: top-1 agreement with the final prediction, KL(final || lens) in nats, and the rank
of the true next token (0 = the lens's top token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.models import ModelHandle

LensKind = Literal["logit", "tuned"]


def logit_lens(handle: ModelHandle, resid_ND: torch.Tensor) -> torch.Tensor:
    """Logits `[N, V]` of residual states `[N, D]` through the final norm and unembedding
    (at the last layer, the model's own logits)."""
    bridge = handle.bridge
    with torch.inference_mode():
        x = bridge.ln_final(resid_ND.to(handle.device, bridge.W_U.dtype))  # the model's own dtype
        logits = x @ bridge.W_U
        bias = getattr(bridge, "b_U", None)
        return (logits + bias if bias is not None else logits).float()


def _augmented(h_ND: torch.Tensor) -> torch.Tensor:
    h = h_ND.detach().double().cpu()
    return torch.cat([h, torch.ones(len(h), 1, dtype=h.dtype)], dim=1)


@dataclass
class TunedLens:
    """Affine maps `[D + 1, D]` per layer from `[h, 1]` to the predicted final residual."""

    maps: dict[int, torch.Tensor]
    fit_loss: dict[int, float]  # fraction of final-residual variance unexplained (fitting split)
    n_fit: int
    ridge: float

    def predict(self, layer: int, h_ND: torch.Tensor) -> torch.Tensor:
        """The predicted final residual `[N, D]` of layer `layer`'s states (float32, on their device)."""
        if layer not in self.maps:
            raise InvalidInputError(f"the tuned lens has no map for layer {layer}; fitted layers: {sorted(self.maps)}")
        return (_augmented(h_ND) @ self.maps[layer]).float().to(h_ND.device)


@dataclass
class TunedLensFitter:
    """Streamed normal equations of the tuned lens: `update` per batch, `merge` across ranks
    (exact), `fit` once."""

    zz: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> sum z z^T [D+1, D+1]
    zy: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> sum z y^T [D+1, D]
    yy: float = 0.0  # sum |y|^2
    y_sum: torch.Tensor | None = None  # sum y [D]
    n: int = 0

    def update(self, states_by_layer: dict[int, torch.Tensor], final_ND: torch.Tensor) -> None:
        """Add a batch: every fitted layer's states `[N, D]` and the same tokens' final residual."""
        y = final_ND.detach().double().cpu()
        for layer, h in states_by_layer.items():
            if len(h) != len(y):
                raise InvalidInputError(f"layer {layer} has {len(h)} tokens, the final residual {len(y)}")
            z = _augmented(h)
            self.zz[layer] = self.zz.get(layer, 0) + z.T @ z
            self.zy[layer] = self.zy.get(layer, 0) + z.T @ y
        self.yy += float((y * y).sum())
        self.y_sum = y.sum(0) if self.y_sum is None else self.y_sum + y.sum(0)
        self.n += len(y)

    def merge(self, other: TunedLensFitter) -> None:
        """Add another fitter's sums (ranks that split the fitting tokens)."""
        if other.n == 0:
            return
        if self.n and set(other.zz) != set(self.zz):
            raise InvalidInputError(f"cannot merge tuned-lens sums of layers {sorted(other.zz)} into {sorted(self.zz)}")
        for layer in other.zz:
            self.zz[layer] = self.zz.get(layer, 0) + other.zz[layer]
            self.zy[layer] = self.zy.get(layer, 0) + other.zy[layer]
        self.yy += other.yy
        self.y_sum = other.y_sum.clone() if self.y_sum is None else self.y_sum + other.y_sum
        self.n += other.n

    def fit(self, ridge: float = 1e-3) -> TunedLens:
        """Ridge least squares per layer (`ridge` times the mean diagonal of `sum z z^T`, the
        bias left unpenalised)."""
        if self.y_sum is None or self.n <= 1:
            raise InvalidInputError(f"the tuned lens needs fitting tokens; got {self.n}")
        total = self.yy - float(self.y_sum @ self.y_sum) / self.n
        maps, losses = {}, {}
        for layer, A in self.zz.items():
            D1 = A.shape[0]
            penalty = torch.eye(D1, dtype=A.dtype) * ridge * float(A.diagonal()[:-1].mean())
            penalty[-1, -1] = 0.0
            W = torch.linalg.solve(A + penalty, self.zy[layer])
            sse = self.yy - 2 * float((W * self.zy[layer]).sum()) + float((W * (A @ W)).sum())
            maps[layer], losses[layer] = W, max(sse, 0.0) / total if total > 0 else float("nan")
        return TunedLens(maps, losses, self.n, ridge)


@dataclass
class LensScores:
    """Per (lens, layer) sums over held-out tokens: agreement, KL and true-token ranks."""

    n: dict[tuple[LensKind, int], int] = field(default_factory=dict)
    agree: dict[tuple[LensKind, int], int] = field(default_factory=dict)
    kl: dict[tuple[LensKind, int], float] = field(default_factory=dict)
    ranks: dict[tuple[LensKind, int], list[np.ndarray]] = field(default_factory=dict)

    def update(self, kind: LensKind, layer: int, lens_logits_NV: torch.Tensor, final_logits_NV: torch.Tensor,
               next_ids_N: torch.Tensor) -> None:
        """Score one batch of lens logits against the final logits of the same tokens and
        their true next tokens."""
        lens = lens_logits_NV.float()  # scored on its own device; only sums and ranks come back
        final = final_logits_NV.float().to(lens.device)
        log_p, log_q = torch.log_softmax(final, -1), torch.log_softmax(lens, -1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        true = lens.gather(1, next_ids_N.to(lens.device).long()[:, None])
        key = (kind, layer)
        self.n[key] = self.n.get(key, 0) + len(lens)
        self.agree[key] = self.agree.get(key, 0) + int((lens.argmax(-1) == final.argmax(-1)).sum())
        self.kl[key] = self.kl.get(key, 0.0) + float(kl.sum())
        self.ranks.setdefault(key, []).append((lens > true).sum(-1).cpu().numpy().astype(np.int64))

    def merge(self, other: LensScores) -> None:
        """Add another scorer's sums and ranks (ranks that split the held-out tokens)."""
        for key in other.n:
            self.n[key] = self.n.get(key, 0) + other.n[key]
            self.agree[key] = self.agree.get(key, 0) + other.agree[key]
            self.kl[key] = self.kl.get(key, 0.0) + other.kl[key]
            self.ranks.setdefault(key, []).extend(other.ranks[key])

    def table(self) -> list[dict[str, Any]]:
        """One row per (lens, layer): top-1 agreement, mean KL, mean and median true-token rank."""
        rows = []
        for (kind, layer) in sorted(self.n):
            ranks = np.concatenate(self.ranks[kind, layer])
            n = self.n[kind, layer]
            rows.append({"lens": kind, "layer": layer, "n_tokens": n, "top1_agreement": self.agree[kind, layer] / n,
                         "kl": self.kl[kind, layer] / n, "mean_rank": float(ranks.mean()),
                         "median_rank": float(np.median(ranks))})
        return rows


def next_token_rows(acts_by_layer: dict[int, torch.Tensor], token_ids_NT: torch.Tensor,
                    excluded_NT: torch.Tensor | None = None) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Flatten `[N, T, D]` states to the rows that have a true next token (every position
    but the last, less `excluded` ones): `({layer: [M, D]}, next ids [M])`."""
    keep = torch.ones_like(token_ids_NT, dtype=torch.bool)
    keep[:, -1] = False
    if excluded_NT is not None:
        keep &= ~excluded_NT.bool()
    next_ids = torch.roll(token_ids_NT, -1, dims=1)[keep]
    return {layer: a[keep.to(a.device)] for layer, a in acts_by_layer.items()}, next_ids


def score_lenses(handle: ModelHandle, rows_by_layer: dict[int, torch.Tensor], next_ids: torch.Tensor,
                 scores: LensScores, tuned: TunedLens | None = None) -> None:
    """Score the logit lens (and `tuned`, when given) at every layer of `rows_by_layer`
    against the model's own logits, read at its last layer (`handle.n_layers - 1`, which
    must be among the rows)."""
    last = handle.n_layers - 1
    if last not in rows_by_layer:
        raise InvalidInputError(f"lens scores need the last layer ({last}) among the layers; got {sorted(rows_by_layer)}")
    final = logit_lens(handle, rows_by_layer[last])
    for layer, rows in rows_by_layer.items():
        scores.update("logit", layer, logit_lens(handle, rows), final, next_ids)
        if tuned is not None:
            scores.update("tuned", layer, logit_lens(handle, tuned.predict(layer, rows)), final, next_ids)
