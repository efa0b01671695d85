"""Exact top-k activating tokens per latent, merged batch by batch with `torch.topk`.

State: the k best values per latent and their payload (block, position, document, the
window of token ids and activations). Each batch contributes its own per-latent top-k
candidates; one `topk` over `[d_sae, 2k]` keeps the best, and payload windows are
gathered only for the candidates that entered. Ties at the k-th place are broken
arbitrarily.
"""

from __future__ import annotations

import torch

from saes.summary.batch import BatchInfo, empty_payload, example_payload


class TopExamples:
    """The exact k highest activations of every latent seen so far, with context windows."""

    def __init__(self, d_sae: int, k: int, before: int, after: int, device: torch.device | str = "cpu") -> None:
        self.k, self.before, self.after = k, before, after
        self.values = torch.full((d_sae, k), -1.0, device=device)
        self.payload = empty_payload((d_sae, k), before + after + 1, device)

    def update(self, f_NF: torch.Tensor, info: BatchInfo) -> None:
        """Merge a batch's activations `[N, d_sae]` (BOS rows zeroed) into the top-k."""
        kk = min(self.k, f_NF.shape[0])
        cand = f_NF.topk(kk, dim=0)
        cand_values, cand_rows = cand.values.T, cand.indices.T  # [F, kk]
        best = torch.cat([self.values, cand_values], dim=1).topk(self.k, dim=1)
        from_state = best.indices.clamp(max=self.k - 1)
        for name, tensor in self.payload.items():
            index = from_state if tensor.dim() == 2 else from_state[..., None].expand_as(tensor)
            self.payload[name] = tensor.gather(1, index)
        self.values = best.values
        latent, slot = (best.indices >= self.k).nonzero(as_tuple=True)
        if len(latent):
            rows = cand_rows[latent, best.indices[latent, slot] - self.k]
            fresh = example_payload(f_NF, info, rows, latent, self.before, self.after)
            for name, tensor in fresh.items():
                self.payload[name][latent, slot] = tensor.to(self.payload[name].dtype)

    def state_nbytes(self) -> int:
        """Bytes of state held (independent of the number of tokens seen)."""
        tensors = [self.values, *self.payload.values()]
        return sum(t.numel() * t.element_size() for t in tensors)
