"""Two models read on the same tokens, every requested layer of each from one paired stream
(`saes.compare.pairs.paired_hook_activations`: shared token ids for one tokenizer, tokens
ending at the same character for two, as `compare` pairs them).

Kept in bounded memory: debiased linear CKA sums between every layer of A and every layer of
B over all paired tokens (`geometry.cka.CKAAccumulator` with `split`: no pair within a
model), and a seeded uniform subsample of the paired tokens' states at every layer of both
(random keys drawn per batch, the `max_points` smallest kept: `saes.depth.reservoir`), for
the per-layer ID and LID shift (`geometry.depth_shift`). One process (no torchrun ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sae_atlas.geometry.cka import CKAAccumulator
from sae_atlas.saes.compare.pairs import paired_hook_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.depth.capture import check_layers
from sae_atlas.saes.depth.reservoir import Reservoir
from sae_atlas.saes.models import ModelHandle


@dataclass
class PairStream:
    """What one paired pass gathered."""

    layers_a: list[int]
    layers_b: list[int]
    states_a: np.ndarray  # [M, La, Da] float32: the subsampled paired tokens at A's layers
    states_b: np.ndarray  # [M, Lb, Db]: the same tokens at B's layers
    n_tokens: int  # paired tokens seen
    cka: CKAAccumulator  # layers ("a", l) then ("b", l), split between them

    def cross_cka(self) -> np.ndarray:
        """Debiased linear CKA `[La, Lb]` between A's and B's layers."""
        return self.cka.result()[: len(self.layers_a), len(self.layers_a):]


def stream_pair(a: ModelHandle, b: ModelHandle, corpus: CorpusSpec, layers_a: list[int], layers_b: list[int], *,
                n_tokens: int, batch_blocks: int = 8, max_points: int = 4000, seed: int = 0,
                progress: bool = True) -> PairStream:
    """Stream about `n_tokens` tokens of `corpus` through both models at once, paired, with
    `hook_resid_post` of every layer of `layers_a` (model `a`) and `layers_b` (model `b`)
    captured; see the module docstring for what is kept. InvalidInputError (naming the
    model) for a layer a model lacks, and when no text aligns across two tokenizers."""
    layers_a, layers_b = check_layers(a, layers_a), check_layers(b, layers_b)
    hooks_a = [f"blocks.{layer}.hook_resid_post" for layer in layers_a]
    hooks_b = [f"blocks.{layer}.hook_resid_post" for layer in layers_b]
    cka = CKAAccumulator(split=len(layers_a))
    sample = Reservoir(max_points, [((len(layers_a), a.d_model), np.float32), ((len(layers_b), b.d_model), np.float32)])
    seen = 0
    pairs = paired_hook_activations(a, hooks_a, b, hooks_b, corpus, n_tokens=n_tokens, batch_blocks=batch_blocks,
                                    progress=progress)
    for number, (acts_a, acts_b) in enumerate(pairs):
        rows_a = [acts_a[h].float().cpu() for h in hooks_a]
        rows_b = [acts_b[h].float().cpu() for h in hooks_b]
        n = len(rows_a[0])
        seen += n
        cka.update({**{("a", layer): r for layer, r in zip(layers_a, rows_a, strict=True)},
                    **{("b", layer): r for layer, r in zip(layers_b, rows_b, strict=True)}})

        def entering(index: np.ndarray, rows_a: list[torch.Tensor] = rows_a,
                     rows_b: list[torch.Tensor] = rows_b) -> list[np.ndarray]:
            i = torch.from_numpy(index)
            return [torch.stack([r[i] for r in rows_a], 1).numpy(), torch.stack([r[i] for r in rows_b], 1).numpy()]

        sample.offer(np.random.default_rng([seed, number]).random(n), entering)
    _, (kept_a, kept_b) = sample.rows()
    return PairStream(layers_a, layers_b, kept_a, kept_b, seen, cka)
