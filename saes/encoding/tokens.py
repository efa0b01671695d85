"""The most active SAE features of every token of one text: one forward pass capturing
every SAE's hook, each token encoded with each SAE, the top-k latents kept; and how token
ids read as text (`decoded_tokens`, `piece_text`), never with a replacement character."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple

import torch

from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.streaming import special_ids
from sae_atlas.store.activations import excluded_positions

REPLACEMENT = "\ufffd"  # what a decoder writes for the bytes of a character cut off
MAX_CHAR_PIECES = 4  # a UTF-8 character has at most 4 bytes, so spans at most 4 byte-level pieces


class TokenFeatureActs(NamedTuple):
    """The top features of every token of a text.

    - `token_ids`: the text's token ids, BOS first.
    - `tokens`: each token as the text reads (`decoded_tokens`): ' October', never the
      byte-level 'ĠOctober'.
    - `special`: per token, whether it is one of the model's special tokens (BOS, EOS,
      padding; `saes.streaming.special_ids`), the positions summaries and evals leave out.
    - `features`: SAE id -> per token -> its up to `k` most active latents with a positive
      activation, most active first, as `{"latent": int, "act": float}`.
    """

    token_ids: list[int]
    tokens: list[str]
    special: list[bool]
    features: dict[str, list[list[dict[str, Any]]]]


def token_features(handle: ModelHandle, saes: Mapping[str, SAE], hooks: Mapping[str, str], text: str,
                   k: int) -> TokenFeatureActs:
    """Run `handle` on `text` (BOS prepended) and keep, per SAE and token, the `k` most
    active latents. `saes` maps an id to a loaded SAE, `hooks` the id to the hook it reads.
    Runs under `torch.inference_mode`; the caller holds any lock the model needs."""
    with torch.inference_mode():
        tokens = handle.to_tokens(text)
        acts = run_hooks(handle, tokens, sorted({hooks[sid] for sid in saes}))
        features = {}
        for sid, sae in saes.items():
            f_TF = sae_codes(sae, acts[hooks[sid]][0])
            values, latents = f_TF.topk(min(k, f_TF.shape[1]), dim=1)
            features[sid] = [
                [{"latent": int(i), "act": float(a)} for a, i in zip(v, ix, strict=True) if a > 0]
                for v, ix in zip(values.tolist(), latents.tolist(), strict=True)
            ]
    ids_T = tokens[0].tolist()
    special = excluded_positions(tokens[0].cpu(), torch.arange(len(ids_T)), prepend_bos=True,
                                 special_ids=list(special_ids(handle)))
    return TokenFeatureActs(ids_T, decoded_tokens(handle.tokenizer, ids_T), special.tolist(), features)


def decoded_tokens(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's text as people read it (' October', not the byte-level piece
    'ĠOctober'). A character whose bytes are split over pieces reads whole on its first
    piece and '' on the others; a piece whose character is cut off by an end of `ids`
    shows its bytes (`piece_text`)."""
    ids = [int(i) for i in ids]
    out = [tokenizer.decode([i]) for i in ids]
    i = 0
    while i < len(ids):
        if REPLACEMENT not in out[i]:
            i += 1
            continue
        for end in range(i + 2, min(i + MAX_CHAR_PIECES, len(ids)) + 1):
            text = tokenizer.decode(ids[i:end])
            if REPLACEMENT not in text:
                out[i:end] = [text, *[""] * (end - i - 1)]
                break
        else:
            out[i], end = piece_text(tokenizer, ids[i]), i + 1
        i = end
    return out


def piece_text(tokenizer: Any, token_id: int) -> str:
    """One token's text on its own; a piece holding only part of a character shows the
    bytes it holds as escapes ('\\xe4\\xbd'), never a replacement character."""
    text = tokenizer.decode([int(token_id)])
    if REPLACEMENT not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    raw = _piece_bytes(piece)
    shown = raw.decode("utf-8", "backslashreplace") if raw is not None else piece
    return shown.replace(REPLACEMENT, "\\ufffd")


def _piece_bytes(piece: str) -> bytes | None:
    """The bytes of a byte-level BPE piece ('ä½' -> b'\\xe4\\xbd') or a byte-fallback
    piece ('<0xE4>'); None for any other piece."""
    fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    alphabet = _byte_level_alphabet()
    return bytes(alphabet[c] for c in piece) if piece and all(c in alphabet for c in piece) else None


@cache
def _byte_level_alphabet() -> dict[str, int]:
    """Character -> byte of GPT-2 style byte-level pieces: printable bytes stand for
    themselves, the others for the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(0x100 + n): b for n, b in enumerate(others)}
