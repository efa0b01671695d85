"""Logit effects of decoder directions: what each latent's decoder row does to the logits.

Convention (documented in store/SCHEMAS.md): the decoder row `d = W_dec[i]` is passed
through the final norm linearly, with the norm's data-dependent scale left out: for an
RMSNorm model `d' = w * d`; for a LayerNorm model `d' = w * (d - mean(d))` (the bias is
a constant shift of every logit and is dropped); with no norm `d' = d`. The effect on
the logits is `d' @ W_U`, one value per vocabulary token, in logit units per unit of
the decoder row as stored.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.tokens import REPLACEMENT, piece_text

NormKind = Literal["rms", "layer", "none"]  # the final norm before the unembedding
NORM_KINDS: tuple[NormKind, ...] = get_args(NormKind)


@dataclass
class LogitEffects:
    """Top and bottom `n` tokens of every latent's logit effect, each `[d_sae, n]`."""

    top_ids: torch.Tensor
    top_values: torch.Tensor
    bottom_ids: torch.Tensor
    bottom_values: torch.Tensor


def logit_directions(
    W_dec_FD: torch.Tensor, final_norm_weight: torch.Tensor | None = None, norm_kind: NormKind = "rms"
) -> torch.Tensor:
    """Decoder rows `[F, D]` mapped through the final norm convention (see module docstring)."""
    if norm_kind not in NORM_KINDS:
        raise InvalidInputError(f"unknown final norm kind {norm_kind!r}; valid: {', '.join(NORM_KINDS)}")
    d = W_dec_FD.detach().float()
    if norm_kind == "layer":
        d = d - d.mean(dim=-1, keepdim=True)
    if final_norm_weight is not None and norm_kind != "none":
        d = d * final_norm_weight.detach().float().to(d.device)
    return d


def _check_shapes(W_dec_FD: torch.Tensor, W_U_DV: torch.Tensor) -> None:
    if W_U_DV.dim() != 2 or W_U_DV.shape[0] != W_dec_FD.shape[1]:
        raise InvalidInputError(
            f"unembedding must be [d_in={W_dec_FD.shape[1]}, d_vocab], got {tuple(W_U_DV.shape)}"
        )


def logit_effects(
    W_dec_FD: torch.Tensor,
    W_U_DV: torch.Tensor,
    *,
    final_norm_weight: torch.Tensor | None = None,
    norm_kind: NormKind = "rms",
    n: int = 10,
    chunk: int = 512,
) -> LogitEffects:
    """The `n` most promoted and most suppressed tokens per latent, in chunks of latents."""
    _check_shapes(W_dec_FD, W_U_DV)
    W_U = W_U_DV.detach().float()
    n = min(n, W_U.shape[1])
    parts: list[tuple[torch.Tensor, ...]] = []
    with torch.no_grad():
        for start in range(0, W_dec_FD.shape[0], chunk):
            d = logit_directions(W_dec_FD[start : start + chunk], final_norm_weight, norm_kind).to(W_U.device)
            logits = d @ W_U
            top, bottom = logits.topk(n, dim=1), logits.topk(n, dim=1, largest=False)
            parts.append((top.indices, top.values, bottom.indices, bottom.values))
    return LogitEffects(*(torch.cat([p[i] for p in parts]).cpu() for i in range(4)))


_DECODED: weakref.WeakKeyDictionary[object, dict[int, tuple[tuple[str, ...], frozenset[int]]]] = (
    weakref.WeakKeyDictionary())


def vocab_strings(tokenizer: object, d_vocab: int) -> tuple[str, ...]:
    """The text of every token id `0..d_vocab-1` on its own (ids beyond the tokenizer give
    ''); a piece holding only part of a character shows its bytes (`piece_text`), never a
    replacement character.

    Decoding a vocabulary takes about a second; it is done once per tokenizer and size and
    remembered while the tokenizer lives, so the SAEs of one summary run share it."""
    return _vocabulary(tokenizer, d_vocab)[0]


def split_piece_ids(tokenizer: object, d_vocab: int) -> frozenset[int]:
    """The ids below `d_vocab` whose piece holds only part of a character: in a sequence
    they read whole with their neighbours (`saes.encoding.tokens.decoded_tokens`)."""
    return _vocabulary(tokenizer, d_vocab)[1]


def _vocabulary(tokenizer: object, d_vocab: int) -> tuple[tuple[str, ...], frozenset[int]]:
    try:
        known = _DECODED.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced is decoded every time
        known = {}
    if d_vocab not in known:
        n = min(d_vocab, len(tokenizer))  # type: ignore[arg-type]
        decoded = tokenizer.batch_decode([[i] for i in range(n)])  # type: ignore[attr-defined]
        split = frozenset(i for i, text in enumerate(decoded) if REPLACEMENT in text)
        texts = [piece_text(tokenizer, i) if i in split else text for i, text in enumerate(decoded)]
        known[d_vocab] = ((*texts, *[""] * (d_vocab - n)), split)
    return known[d_vocab]
