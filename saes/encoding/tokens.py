"""The most active SAE features of every token of one text: one forward pass capturing
every SAE's hook, each token encoded with each SAE, the top-k latents kept."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from saes.encoding.codes import sae_codes
from saes.forward import run_hooks
from saes.models import ModelHandle
from saes.sae.base import SAE


class TokenFeatureActs(NamedTuple):
    """The top features of every token of a text.

    - `token_ids`: the text's token ids, BOS first.
    - `tokens`: each token decoded on its own (`tokenizer.decode([id])`), the text as it
      reads: ' October', never the byte-level 'ĠOctober'.
    - `features`: SAE id -> per token -> its up to `k` most active latents with a positive
      activation, most active first, as `{"latent": int, "act": float}`.
    """

    token_ids: list[int]
    tokens: list[str]
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
    return TokenFeatureActs(ids_T, decoded_tokens(handle.tokenizer, ids_T), features)


def decoded_tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token id decoded on its own, as tokens are shown to people (' October', not
    the tokenizer's byte-level piece 'ĠOctober')."""
    return [tokenizer.decode([int(i)]) for i in ids]
