"""Activation rows that judge an imported SAE: the target hook's held-out split, or, for a
hook the atlas has not cached, a small sample streamed through the model over the atlas's
corpus; plus the rows of the other cached hooks of the same width (to recognise a wrong
hook). For a transcoder the target rows are paired (`saes.train.paired_rows`): its input
hook's activation followed by its output hook's at the same token."""

from __future__ import annotations

import math
from typing import Any

import torch

from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.eval.downstream import downstream_metrics
from sae_atlas.saes.eval.evaluate import evaluate_sae
from sae_atlas.saes.eval.transcoder import replacement_metrics
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.streaming import stream_activations
from sae_atlas.saes.train.paired_rows import PairedReader
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.layout import AtlasLayout


class ImportActivations:
    """Activation rows of the target `hook` (and its same-width neighbours) for the guard;
    `model` is a callable giving the model handle, called only when the model is needed."""

    def __init__(self, layout: AtlasLayout, hook: str, model: Any, n_tokens: int, *, hook_out: str = "") -> None:
        self.layout, self.hook, self.hook_out, self.n_tokens = layout, hook, hook_out, n_tokens
        self.cached = {hook, hook_out} - {""} <= set(layout.cached_hooks())
        self.reader: ActivationReader | PairedReader | None = None
        if self.cached:
            self.reader = PairedReader(layout.root, hook, hook_out) if hook_out else ActivationReader(layout.root, hook)
        self._streamed: tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._streamed_width = 0
        self._rows: dict[str, torch.Tensor] = {}
        self._model = model

    @property
    def width(self) -> int:
        """The target hook's width d (a transcoder's input hook's)."""
        if self.reader is not None:
            return self.reader.d
        self._stream()
        return self._streamed_width

    def _stream(self) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """A sample of the hook streamed through the model over the atlas's corpus
        (`saes.streaming`; BOS and separator positions left out, as in a cache)."""
        if self._streamed is None:
            handle = self._model()
            spec = CorpusSpec(**(self.layout.read_meta().get("corpus") or {}))
            n_blocks = max(1, math.ceil(self.n_tokens / spec.context_size))
            rows, batches = [], []
            hooks = [self.hook, self.hook_out] if self.hook_out else [self.hook]
            for batch in stream_activations(handle, spec, hooks, n_blocks=n_blocks, batch_blocks=8, progress=False):
                self._streamed_width = batch.acts[self.hook].shape[-1]
                acts = torch.cat([batch.acts[h] for h in hooks], dim=-1).float().cpu()
                rows.append(acts[~batch.excluded])
                batches.append((batch.token_ids, batch.excluded))
            self._streamed = (torch.cat(rows)[: self.n_tokens], batches)
        return self._streamed

    def rows(self, hook: str | None = None) -> torch.Tensor:
        """Up to n_tokens non-BOS rows `[n, d]` of the held-out split (or the streamed sample);
        a transcoder's target rows are paired, `[n, d_in + d_out]`."""
        hook = hook or self.hook
        if hook == self.hook and not self.cached:
            return self._stream()[0]
        if hook == self.hook and self.hook_out:
            return torch.cat([self._heldout(self.hook), self._heldout(self.hook_out)], dim=-1)
        return self._heldout(hook)

    def _heldout(self, hook: str) -> torch.Tensor:
        """Up to n_tokens non-BOS held-out rows of one cached hook, in cache order."""
        if hook not in self._rows:
            chunks, left = [], self.n_tokens
            for blocks in ActivationReader(self.layout.root, hook).blocks(split="heldout"):
                chunks.append(blocks.acts[~blocks.is_bos].float()[:left])
                left -= chunks[-1].shape[0]
                if left <= 0:
                    break
            self._rows[hook] = torch.cat(chunks)
        return self._rows[hook]

    def same_width_hooks(self) -> dict[str, torch.Tensor]:
        """Held-out rows of every other cached hook of the target's width."""
        others = [h for h in self.layout.cached_hooks()
                  if h != self.hook and ActivationReader(self.layout.root, h).d == self.width]
        return {h: self.rows(h) for h in others}

    def metrics(self, sae: SAE, with_model: bool, ce_blocks: int) -> dict[str, Any]:
        """`evaluate_sae` metrics of `sae` on the target hook (with the model: CE loss recovered)."""
        if self.reader is not None:
            return evaluate_sae(sae, self.reader, model_handle=self._model() if with_model else None,
                                hook=self.hook, n_tokens=self.n_tokens, ce_blocks=ce_blocks)
        metrics = evaluate_sae(sae, [self.rows()], n_tokens=self.n_tokens)
        if with_model:
            bridge, blocks = self._model().bridge, self._stream()[1][:ce_blocks]
            metrics.update(replacement_metrics([sae], bridge, blocks) if sae.is_transcoder
                           else downstream_metrics(sae, bridge, self.hook, blocks))
        return metrics
