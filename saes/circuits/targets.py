"""The logit nodes of a graph: the top next-token predictions up to a cumulative
probability, or tokens the caller names.

As in circuit-tracer (`attribution/targets.py`), a logit node's direction is the token's
unembedding column minus the mean column, so its value is the token's logit minus the
mean logit (unembedding bias left out): a node explains what lifts this token above the
others, not what lifts every logit together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.tokens import decoded_tokens
from sae_atlas.saes.intervene.attribution import token_id
from sae_atlas.saes.models import ModelHandle


@dataclass
class LogitTargets:
    """Logit nodes: token ids, their text, softmax probabilities at the last position and
    demeaned unembedding directions `[n, d_model]`."""

    ids: list[int]
    tokens: list[str]
    probs: torch.Tensor
    vecs_ND: torch.Tensor


def logit_targets(
    handle: ModelHandle,
    logits_V: torch.Tensor,
    tokens: Sequence[str | int] | None = None,
    *,
    max_logits: int = 10,
    cumulative_prob: float = 0.95,
) -> LogitTargets:
    """The named `tokens` (each exactly one token), or the most probable next tokens until
    their probabilities add up to `cumulative_prob` (at most `max_logits`)."""
    probs = torch.softmax(logits_V.double(), -1)
    if tokens:
        ids = [token_id(handle.tokenizer, t) for t in tokens]
        unk = handle.tokenizer.unk_token_id
        unknown = [t for t, i in zip(tokens, ids, strict=True) if unk is not None and i == unk
                   and t not in (unk, handle.tokenizer.unk_token)]
        if unknown:
            raise InvalidInputError(f"targets {unknown} are not in the model's vocabulary")
        if len(set(ids)) != len(ids):
            raise InvalidInputError(f"targets {list(tokens)} name the same token twice")
    else:
        if not 0 < cumulative_prob <= 1:
            raise InvalidInputError(f"cumulative_prob must be in (0, 1], got {cumulative_prob}")
        if max_logits < 1:
            raise InvalidInputError(f"max_logits must be at least 1, got {max_logits}")
        top_p, top_i = probs.topk(min(max_logits, len(probs)))
        n = int(torch.searchsorted(top_p.cumsum(0), torch.tensor(cumulative_prob, dtype=top_p.dtype))) + 1
        ids = top_i[: min(n, len(top_i))].tolist()
    W_U = handle.W_U.detach()  # noqa: N806 (TransformerLens name)
    vecs = (W_U[:, ids] - W_U.mean(1, keepdim=True)).T
    return LogitTargets(ids, decoded_tokens(handle.tokenizer, ids), probs[ids].to(W_U.dtype), vecs)
