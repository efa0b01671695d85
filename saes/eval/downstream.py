"""Downstream metrics: the model's next-token loss with the SAE spliced in at its hook.

For each batch of held-out token blocks the model runs three times: clean, with the hook's
output replaced by the SAE reconstruction, and with it replaced by zeros (ablation).
BOS positions keep their clean activation in both patched runs (the SAE is not judged on
them, and BOS activations are often 10-100x larger than the rest) and every position that
is BOS or predicts a BOS is left out of the averages.

- `ce_loss_score` (also `ce_loss_recovered`) = (CE_zero - CE_sae) / (CE_zero - CE_clean)
- `kl_div_score` = (KL_zero - KL_sae) / KL_zero, with KL(clean || patched) of the
  next-token distributions (SAEBench "model behavior preservation").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from sae_atlas.saes.hook_fns import HookFn, in_residual, replace_hook
from sae_atlas.saes.sae.base import SAE


def _replacement(fill: Callable[[torch.Tensor], torch.Tensor], keep_BT: torch.Tensor) -> HookFn:
    """A hook fn that returns `fill(act)` except at positions where `keep_BT` is True."""
    return replace_hook(lambda act: torch.where(keep_BT[..., None].to(act.device), act, fill(act).to(act.dtype)))


def _sae_fill(sae: SAE) -> Callable[[torch.Tensor], torch.Tensor]:
    param = sae.W_enc

    def fill(act: torch.Tensor) -> torch.Tensor:
        return sae(act.to(param.device, param.dtype)).x_hat.to(act.device)

    return fill


class DownstreamStats:
    """Sums of per-position CE and KL over the evaluated positions."""

    def __init__(self) -> None:
        self.n_positions = 0
        self.n_blocks = 0
        self.sums = dict.fromkeys(("ce_clean", "ce_sae", "ce_zero", "kl_sae", "kl_zero"), 0.0)

    def update(self, logits: dict[str, torch.Tensor], token_ids: torch.Tensor, is_bos: torch.Tensor) -> None:
        """Add one batch: `logits` of the 'clean', 'sae' and 'zero' runs `[n, T, V]`."""
        mask = ~is_bos[:, :-1] & ~is_bos[:, 1:]
        targets = token_ids[:, 1:][mask]
        logp = {k: v[:, :-1][mask].float().log_softmax(-1) for k, v in logits.items()}
        p_clean = logp["clean"].exp()
        for run in ("clean", "sae", "zero"):
            ce = -logp[run].gather(-1, targets[:, None]).squeeze(-1)
            self.sums[f"ce_{run}"] += float(ce.double().sum())
        for run in ("sae", "zero"):
            kl = (p_clean * (logp["clean"] - logp[run])).sum(-1)
            self.sums[f"kl_{run}"] += float(kl.double().sum())
        self.n_positions += int(mask.sum())
        self.n_blocks += token_ids.shape[0]

    def result(self) -> dict[str, Any]:
        """Mean CE / KL per run and the two scores (None where a denominator is 0)."""
        n = max(self.n_positions, 1)
        ce_clean, ce_sae, ce_zero = (self.sums[f"ce_{r}"] / n for r in ("clean", "sae", "zero"))
        kl_sae, kl_zero = self.sums["kl_sae"] / n, self.sums["kl_zero"] / n
        ce_score = (ce_zero - ce_sae) / (ce_zero - ce_clean) if ce_zero != ce_clean else None
        return {
            "ce_loss_without_sae": ce_clean,
            "ce_loss_with_sae": ce_sae,
            "ce_loss_with_ablation": ce_zero,
            "ce_loss_score": ce_score,
            "ce_loss_recovered": ce_score,
            "kl_div_with_sae": kl_sae,
            "kl_div_with_ablation": kl_zero,
            "kl_div_score": (kl_zero - kl_sae) / kl_zero if kl_zero != 0 else None,
            "n_ce_positions": self.n_positions,
            "n_ce_blocks": self.n_blocks,
        }


@torch.no_grad()
def downstream_metrics(
    sae: SAE,
    bridge: Any,
    hook: str,
    blocks: Iterable[tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, Any]:
    """CE / KL metrics of `sae` spliced into `bridge` at `hook` over `(token_ids, is_bos)`
    batches of whole blocks `[n, T]` (the model runs on each batch three times)."""
    stats = DownstreamStats()
    fill_sae = _sae_fill(sae)
    for token_ids, is_bos in blocks:
        logits = {
            "clean": bridge(token_ids),
            "sae": bridge.run_with_hooks(token_ids, fwd_hooks=in_residual(bridge, [(hook, _replacement(fill_sae, is_bos))])),
            "zero": bridge.run_with_hooks(token_ids,
                                          fwd_hooks=in_residual(bridge, [(hook, _replacement(torch.zeros_like, is_bos))])),
        }
        stats.update(logits, token_ids, is_bos)
    return stats.result()
