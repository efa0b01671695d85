"""SAE feature activations of whole texts: run the model over a list of texts once per
batch (every SAE's hook captured in the same pass), encode each token with each SAE and
pool over the text's tokens (max or mean), giving one row per text.

Texts are tokenized one by one (BOS prepended) and right-padded; the model is causal, so
padding never changes a real token's activation, and padded positions are left out of
the pooling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE

Pool = Literal["max", "mean"]
POOLS: tuple[str, ...] = ("max", "mean")


def tokenize_texts(handle: ModelHandle, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids `[N, T]` of `texts` (BOS prepended) and their lengths `[N]`."""
    if not texts or any(not isinstance(t, str) or not t.strip() for t in texts):
        raise InvalidInputError("texts must be a non-empty list of non-empty strings")
    rows = [handle.to_tokens(t)[0] for t in texts]
    lengths = torch.tensor([len(r) for r in rows])
    pad = handle.tokenizer.pad_token_id
    tokens = torch.full((len(rows), int(lengths.max())), int(pad if pad is not None else 0), dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    return tokens, lengths


def pool_tokens(f_NTF: torch.Tensor, lengths_N: torch.Tensor, pool: Pool) -> torch.Tensor:
    """Pool feature activations over each row's first `lengths[i]` positions: `[N, F]`."""
    mask_NT1 = (torch.arange(f_NTF.shape[1], device=f_NTF.device)[None, :] < lengths_N[:, None].to(f_NTF.device))[..., None]
    if pool == "max":
        return f_NTF.masked_fill(~mask_NT1, float("-inf")).amax(1)
    if pool == "mean":
        return (f_NTF * mask_NT1).sum(1) / lengths_N[:, None].to(f_NTF)
    raise InvalidInputError(f"unknown pooling {pool!r}; valid: {', '.join(POOLS)}")


def pooled_feature_acts(
    handle: ModelHandle,
    saes: Mapping[str, SAE],
    hooks: Mapping[str, str],
    texts: Sequence[str],
    *,
    pool: Pool = "max",
    batch_size: int = 16,
) -> dict[str, np.ndarray]:
    """Per SAE id, the pooled activations `[len(texts), d_sae]` (float32) of every text.
    `saes` maps an id to a loaded SAE, `hooks` the id to the hook it reads."""
    if pool not in POOLS:
        raise InvalidInputError(f"unknown pooling {pool!r}; valid: {', '.join(POOLS)}")
    tokens, lengths = tokenize_texts(handle, texts)
    wanted = sorted({hooks[sid] for sid in saes})
    out: dict[str, list[np.ndarray]] = {sid: [] for sid in saes}
    with torch.inference_mode():
        for start in range(0, len(tokens), batch_size):
            sl = slice(start, start + batch_size)
            width = int(lengths[sl].max())
            acts = run_hooks(handle, tokens[sl, :width], wanted)
            for sid, sae in saes.items():
                f_NTF = sae_codes(sae, acts[hooks[sid]])
                out[sid].append(pool_tokens(f_NTF, lengths[sl], pool).float().cpu().numpy())
    return {sid: np.concatenate(parts) for sid, parts in out.items()}
