"""Aligning two tokenizations of the same text by character spans.

The rule: a token of A and a token of B are paired when their character spans END at the
same offset of the text, so both models have read exactly the same prefix of the text at
the paired positions. Where several tokens of one side end at the same offset (byte-level
pieces of one multi-byte character share its span), the last of them is kept: the
position at which that side has read the whole character. Tokens whose span ends inside
the other side's token have no partner and are left out (e.g. `Mon|day` against `Monday`
pairs only `day` with `Monday`).

Offsets come from a fast (Rust) Hugging Face tokenizer (`return_offsets_mapping`); a
tokenizer without them, or whose spans do not lie inside the text, is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from sae_atlas.errors import InvalidInputError


class TokenSpans(NamedTuple):
    """A text's tokens (no special tokens) and their character spans `[start, end)`."""

    ids: np.ndarray  # [T] int64
    starts: np.ndarray  # [T]
    ends: np.ndarray  # [T]


class AlignedPositions(NamedTuple):
    """Paired token positions of one text (indices into each side's `TokenSpans`)."""

    a: np.ndarray  # [P]
    b: np.ndarray  # [P]
    ends: np.ndarray  # [P] the character offset both tokens end at


def token_spans(tokenizer: Any, text: str, *, side: str = "A") -> TokenSpans:
    """The tokens of `text` (no special tokens) with their character spans; InvalidInputError
    when the tokenizer gives no offsets or spans outside the text."""
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidInputError(f"tokenizer of side {side} gives no character offsets (not a fast tokenizer); "
                                "texts can be aligned across tokenizers only with fast tokenizers")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    if len(offsets) and (offsets.min() < 0 or offsets.max() > len(text) or (offsets[:, 1] < offsets[:, 0]).any()):
        raise InvalidInputError(f"tokenizer of side {side} gave character spans outside the text "
                                f"(length {len(text)}): {offsets.tolist()[:8]}...")
    return TokenSpans(np.asarray(enc["input_ids"], dtype=np.int64), offsets[:, 0], offsets[:, 1])


def _last_token_per_end(spans: TokenSpans) -> dict[int, int]:
    """Character end offset -> the last token (of non-empty span) ending there."""
    return {int(e): i for i, (s, e) in enumerate(zip(spans.starts, spans.ends, strict=True)) if e > s}


def align_spans(a: TokenSpans, b: TokenSpans) -> AlignedPositions:
    """The positions of A and B whose tokens end at the same character (the module's rule)."""
    ends_a, ends_b = _last_token_per_end(a), _last_token_per_end(b)
    common = sorted(set(ends_a) & set(ends_b))
    return AlignedPositions(np.array([ends_a[e] for e in common], dtype=np.int64),
                            np.array([ends_b[e] for e in common], dtype=np.int64), np.array(common, dtype=np.int64))


def align_texts(tokenizer_a: Any, tokenizer_b: Any, texts: Sequence[str]) -> list[tuple[TokenSpans, TokenSpans,
                                                                                             AlignedPositions]]:
    """Both tokenizations of every text and their aligned positions; InvalidInputError when
    no text has a single aligned position."""
    out = []
    for text in texts:
        a, b = token_spans(tokenizer_a, text, side="A"), token_spans(tokenizer_b, text, side="B")
        out.append((a, b, align_spans(a, b)))
    if not any(len(p.a) for _, _, p in out):
        raise InvalidInputError(f"the {len(out)} texts do not align: no token of A ends at the same character as a "
                                "token of B (check that both tokenizers read the same text)")
    return out
