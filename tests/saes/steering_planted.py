"""A planted steering setup on a tiny model: an SAE at the last block whose latent
`PROMOTER` writes the unembedding of a token (it promotes it), latent `DETECTOR` fires on
the token but writes a direction orthogonal to its unembedding, the rest random; and a
steering table that (wrongly) lists the detector as promoting the token, so a ranking
that trusts the table or activations over measurement fails."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import torch

from saes.intervene.steering_search import SteeringSource
from saes.models import ModelHandle, tiny_model
from saes.sae.base import SAEConfig
from saes.sae.registry import build_sae
from store.steering import STEERING_SCHEMA

HOOK = "blocks.1.hook_resid_post"
PROMOTER, DETECTOR, D_SAE = 0, 1, 8
TOKEN = "cat"
TABLE_PROMPTS = (4, 8, 0)  # (n, tokens, seed) the table claims to be measured on


@dataclass
class Planted:
    handle: ModelHandle
    source: SteeringSource
    token_id: int


def planted_steering() -> Planted:
    """The setup of the module docstring."""
    torch.manual_seed(0)
    handle = tiny_model(arch="llama", n_layers=2, seed=4)
    token = int(handle.tokenizer.convert_tokens_to_ids(TOKEN))
    W_U_D = handle.W_U.detach()[:, token].float()
    gen = torch.Generator().manual_seed(0)
    other_D = torch.randn(handle.d_model, generator=gen)
    other_D -= (other_D @ W_U_D) / (W_U_D @ W_U_D) * W_U_D  # orthogonal to the token's unembedding
    text = handle.to_tokens("the cat sat on the mat and a cat ran to the dog")[0]
    acts = {}
    handle.bridge.run_with_hooks(text[None], fwd_hooks=[(HOOK, lambda a, hook=None: acts.setdefault("x", a))])
    x_TD = acts["x"][0].detach().float()
    detect_D = x_TD[text == token].mean(0) - x_TD.mean(0)
    sae = build_sae(SAEConfig(architecture="standard", d_in=handle.d_model, d_sae=D_SAE, hook_name=HOOK)).eval()
    rest = torch.randn(D_SAE - 2, handle.d_model, generator=gen)
    with torch.no_grad():
        W_dec = torch.cat([(W_U_D / W_U_D.norm())[None], (other_D / other_D.norm())[None], rest])
        sae.W_dec.copy_(W_dec / W_dec.norm(dim=-1, keepdim=True))
        sae.W_enc.copy_(torch.cat([W_U_D[:, None] * 0.01, detect_D[:, None],
                                   torch.randn(handle.d_model, D_SAE - 2, generator=gen) * 0.01], 1))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    empty = {"promoted_ids": [], "promoted_deltas": [], "suppressed_ids": [], "suppressed_deltas": []}
    rows = [{"latent": i, "alpha": 1.0, "output_score": 0.0, "lens_top_prob": 0.0, "lens_best_rank": 0.0, "kl": 0.0,
             **empty} for i in range(D_SAE)]
    rows[DETECTOR].update(promoted_ids=[token], promoted_deltas=[2.0])
    table = pl.DataFrame(rows, schema=STEERING_SCHEMA)
    source = SteeringSource("planted", HOOK, sae, np.ones(D_SAE, np.float32), table, TABLE_PROMPTS)
    return Planted(handle, source, token)
