"""Seeded generation with and without edits, and the next-token distribution shift.

`generate_tokens` decodes greedily (`temperature=0`) or by sampling from a seeded
generator, one full forward pass per new token through the spliced model. `compare`
generates the baseline (SAEs spliced, no edits) and the edited continuation with the
same seed and reports how the first next-token distribution moved: the tokens that rise
and fall most in probability and `KL(baseline || edited)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from saes.intervene.splice import Splice
from saes.models import ModelHandle
from store.errors import InvalidInputError


@dataclass
class TokenShift:
    token: str
    token_id: int
    p_baseline: float
    p_edited: float


@dataclass
class Generation:
    """Baseline vs edited continuation of one prompt, and the next-token shift."""

    prompt: str
    baseline_ids: list[int]
    edited_ids: list[int]
    baseline_text: str
    edited_text: str
    rising: list[TokenShift]
    falling: list[TokenShift]
    kl: float  # KL(baseline || edited) of the next-token distributions, nats


@torch.inference_mode()
def generate_tokens(
    handle: ModelHandle,
    prompt_ids_T: torch.Tensor,
    splice: Splice,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    stop_at_eos: bool = True,
) -> tuple[list[int], torch.Tensor]:
    """New token ids and the first step's next-token logits `[V]` of the spliced model."""
    if temperature < 0:
        raise InvalidInputError(f"temperature must be >= 0, got {temperature}")
    gen = torch.Generator().manual_seed(seed)
    ids = prompt_ids_T.clone()
    hooks = splice.fwd_hooks()
    eos = handle.tokenizer.eos_token_id
    new: list[int] = []
    first = None
    for _ in range(max_new_tokens):
        logits_V = handle.bridge.run_with_hooks(ids[None], fwd_hooks=hooks)[0, -1].float()
        if first is None:
            first = logits_V
        if temperature == 0:
            nxt = int(logits_V.argmax())
        else:
            nxt = int(torch.multinomial(torch.softmax(logits_V / temperature, -1), 1, generator=gen))
        new.append(nxt)
        ids = torch.cat([ids, torch.tensor([nxt])])
        if stop_at_eos and nxt == eos:
            break
    if first is None:
        first = handle.bridge.run_with_hooks(ids[None], fwd_hooks=hooks)[0, -1].float()
    return new, first


def distribution_shift(
    tokenizer: Any, base_V: torch.Tensor, edit_V: torch.Tensor, k: int = 10
) -> tuple[list[TokenShift], list[TokenShift], float]:
    """The `k` tokens whose probability rises most and falls most, and KL(base || edited)."""
    logp, logq = torch.log_softmax(base_V.double(), -1), torch.log_softmax(edit_V.double(), -1)
    p, q = logp.exp(), logq.exp()
    kl = float((p * (logp - logq)).sum())
    diff = q - p

    def rows(idx: torch.Tensor) -> list[TokenShift]:
        return [TokenShift(tokenizer.decode([int(i)]), int(i), float(p[i]), float(q[i])) for i in idx]

    return rows(diff.topk(k).indices), rows((-diff).topk(k).indices), kl


def compare(
    handle: ModelHandle,
    prompt: str,
    prompt_ids_T: torch.Tensor,
    baseline: Splice,
    edited: Splice,
    *,
    max_new_tokens: int = 20,
    temperature: float = 0.0,
    seed: int = 0,
    k: int = 10,
) -> Generation:
    """Generate from `baseline` and `edited` with the same seed; see the module docstring."""
    base_ids, base_V = generate_tokens(handle, prompt_ids_T, baseline, max_new_tokens=max_new_tokens,
                                       temperature=temperature, seed=seed)
    edit_ids, edit_V = generate_tokens(handle, prompt_ids_T, edited, max_new_tokens=max_new_tokens,
                                       temperature=temperature, seed=seed)
    rising, falling, kl = distribution_shift(handle.tokenizer, base_V, edit_V, k)
    tok = handle.tokenizer
    return Generation(prompt, base_ids, edit_ids, tok.decode(base_ids), tok.decode(edit_ids), rising, falling, kl)
