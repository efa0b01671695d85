"""Patched forward passes at the concept token and how the model's answer changes.

The caller (the api layer) computes the replacement activations, e.g. a representation
moved along a fitted circle, a random-subspace swap, a mean ablation or a whole-layer
patch from another prompt; this module runs the model with them and measures the answer:
the logit difference `logit(new answer) - logit(old answer)` at the last token and whether
the top answer among the concept's value tokens is the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.concepts import Patch, TokenizedPrompts, run_prompts
from sae_atlas.saes.models import ModelHandle


@dataclass
class AnswerMetrics:
    """Per-prompt logit differences and the summary numbers."""

    logit_diff_N: torch.Tensor  # logit(new) - logit(old)
    hit_N: torch.Tensor  # bool: argmax over the candidate tokens is the new answer
    mean_logit_diff: float
    accuracy: float

    def summary(self) -> dict[str, float]:
        return {"mean_logit_diff": self.mean_logit_diff, "accuracy": self.accuracy}


def answer_metrics(
    logits_NV: torch.Tensor,
    old_ids_N: torch.Tensor,
    new_ids_N: torch.Tensor,
    candidate_ids: list[int],
) -> AnswerMetrics:
    """Logit difference of new vs old answer tokens, and accuracy of landing on the new one
    (argmax restricted to `candidate_ids`, the value tokens)."""
    if logits_NV.ndim != 2 or old_ids_N.shape != new_ids_N.shape or len(old_ids_N) != len(logits_NV):
        raise InvalidInputError(
            f"need logits [N, V] and answer ids [N]; got {tuple(logits_NV.shape)}, "
            f"{tuple(old_ids_N.shape)}, {tuple(new_ids_N.shape)}"
        )
    rows = torch.arange(len(logits_NV))
    diff = (logits_NV[rows, new_ids_N] - logits_NV[rows, old_ids_N]).float()
    cand = torch.tensor(candidate_ids)
    top = cand[logits_NV[:, cand].argmax(1)]
    hit = top == new_ids_N
    return AnswerMetrics(diff, hit, float(diff.mean()), float(hit.float().mean()))


def patched_logits(
    handle: ModelHandle,
    batch: TokenizedPrompts,
    hook: str | None = None,
    replacement_ND: torch.Tensor | None = None,
    *,
    capture: tuple[str, ...] = (),
    batch_size: int = 64,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Last-token logits `[N, V]` with the concept token's activation at `hook` replaced by
    `replacement_ND` (clean when both are None), plus activations captured at `capture`."""
    if (hook is None) != (replacement_ND is None):
        raise InvalidInputError("give both a hook and replacement activations, or neither")
    patch = None if hook is None else Patch(hook, torch.as_tensor(replacement_ND, dtype=torch.float32))
    out = run_prompts(handle, batch, capture=capture, patch=patch, logits=True, batch_size=batch_size)
    return cast(torch.Tensor, out.logits), out.acts  # logits=True: always present
