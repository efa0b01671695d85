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

from sae_atlas.saes.intervene.steering_search import SteeringSource
from sae_atlas.saes.models import ModelHandle, tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.steering import STEERING_SCHEMA

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


SPECIFIC, CLASS, DEAD, GATED = 0, 1, 2, 3
D_SPECIFIC = 10
RANK_TEXTS = ["the cat sat on the mat", "a dog ran to the cat", "the cow sat on the", "a cat ran to a",
              "the horse sat on a mat", "a dog sat on the"]
CONFIRM_TEXTS = ["the cat sat and", "a dog ran and", "the cow ran and", "a mat and", "the horse and", "a cat and"]


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm()


def planted_specificity() -> Planted:
    """An SAE at the last block of the tiny model whose latents steer toward "cat" in
    different ways: `SPECIFIC` writes some of the token's unembedding (cosine 0.45, the rest
    noise); `CLASS` writes the unembeddings of every animal (raises the class, and the
    token about as much); `DEAD`
    writes the token's unembedding exactly but never fires (density 0); `GATED` writes the
    unembedding exactly and fires hard on the last token of prompts that end in "and" (the
    confirmation texts `CONFIRM_TEXTS`, not the ranking texts `RANK_TEXTS`), so clamping it
    helps on the ranking prompts and hurts on the confirmation ones. The rest random."""
    handle = tiny_model(arch="llama", n_layers=2, seed=4)
    tok = handle.tokenizer
    ids = {w: int(tok.convert_tokens_to_ids(w)) for w in ("cat", "dog", "horse", "cow")}
    W_U = handle.W_U.detach().float()
    u = _unit(W_U[:, ids["cat"]])
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(handle.d_model, generator=gen)
    noise = _unit(noise - (noise @ u) * u)
    rows = torch.zeros(D_SPECIFIC, handle.d_model)
    rows[SPECIFIC] = 0.45 * u + (1 - 0.45**2) ** 0.5 * noise
    rows[CLASS] = _unit(sum(_unit(W_U[:, i]) for i in ids.values()))
    rows[DEAD] = u
    rows[GATED] = u
    rows[4:] = torch.randn(D_SPECIFIC - 4, handle.d_model, generator=gen)
    acts: dict[str, torch.Tensor] = {}

    def last(texts: list[str]) -> torch.Tensor:
        out = []
        for text in texts:
            handle.bridge.run_with_hooks(handle.to_tokens(text), fwd_hooks=[(HOOK, lambda a, hook=None: acts.update(x=a))])
            out.append(acts["x"][0, -1].detach().float())
        return torch.stack(out)

    rank, confirm = last(RANK_TEXTS), last(CONFIRM_TEXTS)
    gate = _unit(confirm.mean(0) - rank.mean(0))
    mid = float(((confirm @ gate).min() + (rank @ gate).max()) / 2)
    scale = 50.0 * float(rank.norm(dim=-1).mean()) / max(float((confirm @ gate).min()) - mid, 1e-3)
    sae = build_sae(SAEConfig(architecture="standard", d_in=handle.d_model, d_sae=D_SPECIFIC, hook_name=HOOK)).eval()
    with torch.no_grad():
        sae.W_dec.copy_(rows / rows.norm(dim=-1, keepdim=True))
        sae.W_enc.zero_()
        sae.b_enc.fill_(-1.0)  # nothing fires ...
        sae.W_enc[:, GATED] = gate * scale  # ... but the gate on the confirmation texts
        sae.b_enc[GATED] = -mid * scale
        sae.b_dec.zero_()
    empty = {"promoted_ids": [], "promoted_deltas": [], "suppressed_ids": [], "suppressed_deltas": []}
    table = pl.DataFrame([{"latent": i, "alpha": 1.0, "output_score": 0.0, "lens_top_prob": 0.0, "lens_best_rank": 0.0,
                           "kl": 0.0, **empty} for i in range(D_SPECIFIC)], schema=STEERING_SCHEMA)
    density = np.full(D_SPECIFIC, 0.01)
    density[DEAD] = 0.0
    source = SteeringSource("specific", HOOK, sae, np.ones(D_SPECIFIC, np.float32), table, TABLE_PROMPTS, density)
    return Planted(handle, source, ids["cat"])


PARTS = (0, 1, 2)
D_COMBINED = 12


def planted_combination() -> Planted:
    """An SAE at the last block whose latents 0, 1 and 2 each write the unembedding of
    "cat" plus a large share of noise, the noise cancelling in their sum: the steering
    direction toward the token is made of the three (`PARTS`), equal weights; the rest
    random."""
    handle = tiny_model(arch="llama", n_layers=2, seed=4)
    token = int(handle.tokenizer.convert_tokens_to_ids("cat"))
    u = _unit(handle.W_U.detach().float()[:, token])
    gen = torch.Generator().manual_seed(2)
    q, _ = torch.linalg.qr(torch.cat([u[:, None], torch.randn(handle.d_model, 2, generator=gen)], 1))
    a, b = q[:, 1], q[:, 2]
    rows = torch.randn(D_COMBINED, handle.d_model, generator=gen)
    rows[0], rows[1], rows[2] = u + 2 * a, u + 2 * b, u - 2 * a - 2 * b
    sae = build_sae(SAEConfig(architecture="standard", d_in=handle.d_model, d_sae=D_COMBINED, hook_name=HOOK)).eval()
    with torch.no_grad():
        sae.W_dec.copy_(rows / rows.norm(dim=-1, keepdim=True))
    empty = {"promoted_ids": [], "promoted_deltas": [], "suppressed_ids": [], "suppressed_deltas": []}
    table = pl.DataFrame([{"latent": i, "alpha": 1.0, "output_score": 0.0, "lens_top_prob": 0.0, "lens_best_rank": 0.0,
                           "kl": 0.0, **empty} for i in range(D_COMBINED)], schema=STEERING_SCHEMA)
    source = SteeringSource("combined", HOOK, sae, np.ones(D_COMBINED, np.float32), table, TABLE_PROMPTS,
                            np.full(D_COMBINED, 0.01))
    return Planted(handle, source, token)
