"""Rows a cross-layer transcoder trains and is judged on: at each token, the input of every
MLP and the output of every MLP, `[n, 2, L, d]` (`[:, 0]` the inputs, `[:, 1]` the
outputs), from an atlas's caches (all 2L hooks cached in one run) or streamed through the
model; and its metrics on such rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.streaming import stream_activations
from sae_atlas.saes.train.paired_rows import check_same_tokens
from sae_atlas.saes.transcoders.clt import CLTConfig, CrossLayerTranscoder
from sae_atlas.store.activations import ActivationReader, Split


class CLTReader:
    """The caches of every MLP input and output hook of a CLT, read as aligned rows
    `[B, 2, L, d]`; InvalidInputError unless one cache run wrote them all."""

    def __init__(self, root: Any, hooks_in: list[str], hooks_out: list[str]) -> None:
        self.inputs = [ActivationReader(root, h) for h in hooks_in]
        self.outputs = [ActivationReader(root, h) for h in hooks_out]
        check_same_tokens(self.inputs + self.outputs, "train a cross-layer transcoder on them")

    first = property(lambda self: self.inputs[0])
    model = property(lambda self: self.first.model)
    d = property(lambda self: self.first.d)
    context_size = property(lambda self: self.first.context_size)
    manifest = property(lambda self: self.first.manifest)

    def count_tokens(self, split: Split = "all") -> int:
        return self.first.count_tokens(split)

    def batches(self, batch_size: int, **options: Any) -> Iterator[torch.Tensor]:
        """Seeded shuffled batches `[batch_size, 2, L, d]`; the options are
        `ActivationReader.batches`' and apply to every hook, so all draw the same tokens."""
        streams = [r.batches(batch_size, **options) for r in self.inputs + self.outputs]
        L = len(self.inputs)
        for parts in zip(*streams, strict=True):
            yield torch.stack(parts, dim=1).unflatten(1, (2, L))


def streamed_rows(handle: ModelHandle, cfg: CLTConfig, spec: CorpusSpec, n_tokens: int) -> torch.Tensor:
    """Up to `n_tokens` rows `[n, 2, L, d]` streamed through the model over `spec`
    (`saes.streaming`), BOS and separator positions left out as in a cache's rows."""
    hooks = cfg.hooks_in + cfg.hooks_out
    rows, left = [], n_tokens
    n_blocks = max(1, math.ceil(n_tokens / spec.context_size))
    for batch in stream_activations(handle, spec, hooks, n_blocks=n_blocks, batch_blocks=8, progress=False):
        acts = torch.stack([batch.acts[h].float().cpu() for h in hooks], dim=2)[~batch.excluded]  # [m, 2L, d]
        rows.append(acts.reshape(-1, 2, cfg.n_layers, acts.shape[-1])[:left])
        left -= rows[-1].shape[0]
        if left <= 0:
            break
    return torch.cat(rows)


@torch.no_grad()
def clt_metrics(clt: CrossLayerTranscoder, rows: torch.Tensor, batch_size: int = 1024) -> dict[str, Any]:
    """On rows `[n, 2, L, d]`: `fvu` (squared error summed over layers over the summed
    variance), `fvu_per_layer`, `l0` (active features per token, all layers), `l0_per_layer`
    and `dead_fraction` (features that never fired)."""
    L, F = clt.cfg.n_layers, clt.cfg.d_sae
    err, fired, active = torch.zeros(L, dtype=torch.float64), torch.zeros(L, F, dtype=torch.bool), torch.zeros(L)
    dtype = clt.W_enc.dtype
    for lo in range(0, len(rows), batch_size):
        x, y = rows[lo: lo + batch_size, 0], rows[lo: lo + batch_size, 1]
        out = clt(x.to(clt.W_enc.device, dtype))
        err += (out.x_hat.double().cpu() - y.double()).pow(2).sum((0, 2))
        f = out.feature_acts.cpu() != 0
        fired |= f.any(0)
        active += f.sum((0, 2)).float()
    y = rows[:, 1].double()
    var = (y - y.mean(0)).pow(2).sum((0, 2)).clamp_min(1e-12)
    n = len(rows)
    return {"fvu": float(err.sum() / var.sum()), "fvu_per_layer": (err / var).tolist(),
            "l0": float(active.sum() / n), "l0_per_layer": (active / n).tolist(),
            "dead_fraction": float(1 - fired.float().mean()), "n_tokens": n}
