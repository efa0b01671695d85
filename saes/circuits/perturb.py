"""Node values of the replacement model under a batch of perturbations.

Each batch row multiplies every source node's contribution by `scale[b, node]` (1 keeps
it, 0 removes it) and adds `add[b, node]` to a feature's activation. A feature's
contribution is its activation times its decoder row; an error node's its error vector;
a token's its embedding. Attention patterns and norm scales stay frozen at their clean
values. With `recompute=False` every feature keeps its clean activation (then, over
transcoders, a removed source changes each node by exactly its adjacency entry); with
`recompute=True` each dictionary re-encodes its live input, so effects pass through the
features downstream (the local replacement model itself), errors staying fixed.
"""

from __future__ import annotations

import torch

from sae_atlas.saes.circuits.dictionaries import Dictionary, decode_at
from sae_atlas.saes.circuits.graph import Graph
from sae_atlas.saes.circuits.replacement import encode, frozen_forward
from sae_atlas.saes.models import ModelHandle


@torch.no_grad()
def node_values(handle: ModelHandle, graph: Graph, scale_BN: torch.Tensor, add_BN: torch.Tensor | None = None, *,
                recompute: bool = False) -> torch.Tensor:
    """`[B, N]` values of the graph's nodes (features' pre-activations, logit nodes' demeaned
    logits, NaN for errors and tokens) with each row's perturbation applied."""
    assert graph.replacement is not None, "the graph keeps its replacement model"
    dset, cap = graph.replacement
    B, N = scale_BN.shape
    dtype = cap.embed_TD.dtype
    scale_BN, add_BN = scale_BN.to(dtype), (torch.zeros_like(scale_BN) if add_BN is None else add_BN).to(dtype)
    f, T, start = graph.features, graph.n_pos, cap.start
    pre: dict[int, torch.Tensor] = {}
    written: dict[int, torch.Tensor] = {}  # each dictionary's (edited) codes, filled in layer order
    final: list[torch.Tensor] = []
    index = {d.id: i for i, d in enumerate(dset.items)}
    dev = cap.embed_TD.device

    def write(d: Dictionary, act: torch.Tensor, x_in: torch.Tensor) -> torch.Tensor:
        i, sae = index[d.id], d.sae
        pre[i] = sae.encode_pre(x_in.to(sae.W_dec.dtype)).to(dtype)
        codes = encode(d, x_in) if recompute else cap.codes[d.id][None].expand(B, -1, -1).clone()
        codes[:, :start] = 0
        mine = (f.dictionary == i).nonzero()[:, 0]
        b = torch.arange(B)[:, None]
        p, lat = f.pos[mine][None].expand(B, -1), f.latent[mine][None].expand(B, -1)
        codes[b, p, lat] = codes[b, p, lat] * scale_BN[:, mine].to(dev) + add_BN[:, mine].to(dev)
        err_scale = scale_BN[:, graph.error_index(i, 0): graph.error_index(i, 0) + T].to(dev)
        skip_live = sae.skip_out(x_in.to(sae.W_dec.dtype)).to(dtype)
        skip_clean = sae.skip_out(cap.x_in[d.id].to(sae.W_dec.dtype)).to(dtype)
        written[i] = codes.to(dtype)
        out = decode_at(dset, i, written) + cap.errors[d.id] * err_scale[..., None]
        out[:, :start] = cap.out[d.id][:start] - skip_clean[:start]
        return (out + skip_live).to(act.dtype)

    def embed(act: torch.Tensor) -> torch.Tensor:
        return act * scale_BN[:, graph.token_slice].to(dev)[..., None].to(act.dtype)

    def keep_final(act: torch.Tensor) -> torch.Tensor:
        final.append(act)
        return act[:, -1:]  # the logits go unused: unembed the last position only

    frozen_forward(handle, dset, cap, B, write, embed=embed, final=keep_final)
    values = torch.full((B, N), float("nan"), dtype=dtype)
    for i in range(len(dset.items)):
        mine = (f.dictionary == i).nonzero()[:, 0]
        values[:, mine] = pre[i][:, f.pos[mine], f.latent[mine]].cpu()
    values[:, graph.logit_slice] = (final[0][:, -1].to(dtype) @ graph.logits.vecs_ND.T.to(dtype).to(dev)).cpu()
    return values
