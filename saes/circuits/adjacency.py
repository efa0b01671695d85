"""The direct-effect adjacency of a prompt, by batched backward passes (circuit-tracer's
`attribute`, Ameisen et al. 2025).

One forward pass runs `batch_size` copies of the prompt through the replacement model
(`saes.circuits.replacement`): attention patterns and norm scales frozen, and at each
dictionary's write hook a fixed vector (a leaf the gradient is read from; a transcoder's
skip term stays live). Each backward pass then computes one adjacency row per copy: copy
`b` takes the gradient of one target node (a feature's pre-activation `W_enc[:, i] . x_in`
at its position, or a logit node's demeaned unembedding direction at the last position),
and the gradient at every write hook and at the token embeddings, dotted with each
source's vector (a feature's `a_i W_dec[i]`, an error vector, a token embedding), is the
row. So the passes needed grow with the number of active features, not with the width of
the dictionaries.

Over transcoders or a cross-layer transcoder (whose features write every later MLP
output: a feature's edge sums its decoder rows against the gradient at each hook it writes)
the replacement model is affine in the sources, so each entry is the exact change of the
target when the source is removed with everything else fixed. Over
residual SAEs (Marks et al. 2024) the stream is cut at every SAE and the MLPs between
two SAEs stay non-linear: edges are first-order (gradient x activation).
"""

from __future__ import annotations

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.circuits.dictionaries import Dictionary, decoders, dictionary_set, frozen_mlps
from sae_atlas.saes.circuits.graph import FeatureNodes, Graph
from sae_atlas.saes.circuits.replacement import capture, frozen_forward
from sae_atlas.saes.circuits.targets import logit_targets
from sae_atlas.saes.encoding.tokens import decoded_tokens
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.transcoders.clt import CrossLayerTranscoder


def _active(dset_items: tuple[Dictionary, ...], codes: dict[str, torch.Tensor]) -> FeatureNodes:
    parts = []
    for i, d in enumerate(dset_items):
        pos, lat = codes[d.id].nonzero(as_tuple=True)
        parts.append((torch.full_like(pos, i), pos, lat, codes[d.id][pos, lat]))
    cat = [torch.cat(p) for p in zip(*parts, strict=True)]
    return FeatureNodes(*cat)


def build_graph(
    handle: ModelHandle,
    saes: dict[str, SAE | CrossLayerTranscoder],
    token_ids_T: torch.Tensor,
    *,
    targets: list[str | int] | None = None,
    max_logits: int = 10,
    cumulative_prob: float = 0.95,
    batch_size: int = 64,
    skip_bos: bool = True,
    max_features: int = 20_000,
    freeze_mlps: bool = False,
) -> Graph:
    """The attribution graph of the next-token prediction after `token_ids_T [T]` over the
    dictionaries `saes` (id -> module, or one id -> a cross-layer transcoder; see
    `saes.circuits.dictionaries`), with logit nodes
    for `targets` or the top predictions (`saes.circuits.targets`). `batch_size` adjacency
    rows are computed per backward pass; InvalidInputError when more than `max_features`
    features are active. `freeze_mlps` lets transcoders at some layers stand with the other
    MLPs frozen (`saes.circuits.dictionaries.frozen_mlps`: their outputs are error nodes)."""
    if token_ids_T.ndim != 1 or len(token_ids_T) == 0:
        raise InvalidInputError(f"need token ids [T], got shape {tuple(token_ids_T.shape)}")
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be at least 1, got {batch_size}")
    if freeze_mlps and saes and all(isinstance(m, CrossLayerTranscoder) or m.is_transcoder for m in saes.values()):
        saes = {**saes, **frozen_mlps(handle, saes)}
    dset = dictionary_set(handle, saes)
    cap = capture(handle, dset, token_ids_T, skip_bos=skip_bos)
    feats = _active(dset.items, cap.codes)
    n_f, n_d, T = len(feats), len(dset.items), len(token_ids_T)
    if n_f > max_features:
        raise InvalidInputError(f"{n_f} features are active on this prompt; the limit is {max_features}")
    lt = logit_targets(handle, cap.logits_TV[-1], targets, max_logits=max_logits, cumulative_prob=cumulative_prob)
    dtype, dev = cap.embed_TD.dtype, cap.embed_TD.device
    n_nodes = n_f + n_d * T + T + len(lt.ids)
    adjacency = torch.zeros(n_nodes, n_nodes, dtype=dtype)

    # target rows: (site, position, injected vector); site = dictionary index, or -1 for the logits
    enc_vecs = torch.zeros(n_f, handle.d_model, dtype=dtype)  # W_enc[:, i]: the gradient of a pre-activation
    for i, d in enumerate(dset.items):
        mine = feats.dictionary == i
        enc_vecs[mine] = d.sae.W_enc.detach().to(dtype).T[feats.latent[mine]].cpu()
    row_site = torch.cat([feats.dictionary, torch.full((len(lt.ids),), -1)])
    row_pos = torch.cat([feats.pos, torch.full((len(lt.ids),), T - 1)])
    row_vec = torch.cat([enc_vecs, lt.vecs_ND.to(dtype).cpu()])
    row_node = torch.cat([torch.arange(n_f), torch.arange(n_nodes - len(lt.ids), n_nodes)])

    # source vectors per dictionary: active features' a_i W_dec[i], errors
    by_dict = [(feats.dictionary == i).nonzero()[:, 0] for i in range(n_d)]
    dec = [(feats.activation[idx, None, None] * decoders(d).detach()[feats.latent[idx]]).to(dtype)
           for d, idx in zip(dset.items, by_dict, strict=True)]  # [n_i, K_i, d]: to the K_i write hooks from i on

    batch = min(batch_size, len(row_node))
    leaves = {d.id: cap.out[d.id][None].expand(batch, -1, -1).clone().requires_grad_(True) for d in dset.items}
    reads: dict[int, torch.Tensor] = {}
    index = {d.id: i for i, d in enumerate(dset.items)}

    def write(d: Dictionary, act: torch.Tensor, x_in: torch.Tensor) -> torch.Tensor:
        reads[index[d.id]] = x_in
        skip = d.sae.skip_out(x_in.to(d.sae.W_dec.dtype)).to(act.dtype)
        return leaves[d.id] + skip - skip.detach()

    embed_leaf = cap.embed_TD[None].expand(batch, -1, -1).clone().requires_grad_(True)

    def final(act: torch.Tensor) -> torch.Tensor:
        reads[-1] = act
        return act[:, -1:]  # the unembedding only needs the last position (its logits go unused)

    with torch.enable_grad():
        frozen_forward(handle, dset, cap, batch, write, embed=lambda act: embed_leaf, final=final)
        inputs = [leaves[d.id] for d in dset.items] + [embed_leaf]
        for lo in range(0, len(row_node), batch):
            hi = min(lo + batch, len(row_node))
            b = torch.arange(hi - lo)
            loss = torch.zeros((), dtype=dtype, device=dev)
            for site in row_site[lo:hi].unique().tolist():
                m = row_site[lo:hi] == site
                loss = loss + (reads[site][b[m], row_pos[lo:hi][m]] * row_vec[lo:hi][m].to(dev)).sum()
            grads = torch.autograd.grad(loss, inputs, retain_graph=hi < len(row_node), allow_unused=True)
            rows = row_node[lo:hi]
            g_at = [None if g is None else g[: hi - lo].detach() for g in grads[:-1]]
            for i, d in enumerate(dset.items):
                idx = by_dict[i]
                if len(idx):  # a feature's edge: its decoder rows against the gradient at every hook it writes
                    parts = [torch.einsum("bnd,nd->bn", g_at[i + k][:, feats.pos[idx]], dec[i][:, k].to(dev))
                             for k in range(dec[i].shape[1]) if g_at[i + k] is not None]
                    if parts:
                        adjacency[rows[:, None], idx[None]] = sum(parts).cpu()
                if g_at[i] is not None:
                    cols = n_f + i * T + torch.arange(T)
                    adjacency[rows[:, None], cols[None]] = torch.einsum("btd,td->bt", g_at[i], cap.errors[d.id]).cpu()
            if grads[-1] is not None:
                cols = n_f + n_d * T + torch.arange(T)
                adjacency[rows[:, None], cols[None]] = torch.einsum(
                    "btd,td->bt", grads[-1][: hi - lo].detach(), cap.embed_TD).cpu()

    values = torch.full((n_nodes,), float("nan"), dtype=dtype)
    for i, d in enumerate(dset.items):
        idx = by_dict[i]
        pre = d.sae.encode_pre(cap.x_in[d.id].to(d.sae.W_dec.dtype)).detach().to(dtype)
        values[idx] = pre[feats.pos[idx], feats.latent[idx]].cpu()
    values[n_nodes - len(lt.ids):] = (cap.final_TD[-1] @ lt.vecs_ND.T.to(dtype)).cpu()
    return Graph(
        prompt=handle.tokenizer.decode(token_ids_T.tolist()),
        tokens=decoded_tokens(handle.tokenizer, token_ids_T.tolist()),
        token_ids=token_ids_T.tolist(),
        kind=dset.kind,
        dictionaries=dset.ids,
        layers=[d.layer for d in dset.items],
        hooks=[(d.read_hook, d.write_hook) for d in dset.items],
        features=FeatureNodes(feats.dictionary, feats.pos, feats.latent, feats.activation.detach().cpu()),
        logits=lt,
        adjacency=adjacency,
        values=values,
        linear=dset.kind != "residual",
        start=cap.start,
        settings={"batch_size": batch_size, "max_logits": max_logits, "cumulative_prob": cumulative_prob,
                  "skip_bos": skip_bos, "backward_passes": -(-len(row_node) // batch)},
        replacement=(dset, cap),
    )
