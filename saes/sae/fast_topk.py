"""Fast TopK training path: one dense encoder GEMM, everything else touches k rows.

The dense pre-activations `pre [B, d_sae]` are computed once without autograd and only
used to choose indices. The chosen entries re-enter autograd through `_GatheredPre`,
whose backward builds the encoder gradients from the `[B, m]` sparse gradient alone:
`grad W_enc = x_c^T S` (a sparse-dense product), `grad b_enc = colsum(S)` and, when
`b_dec` is subtracted from the input, `grad b_dec -= W_enc colsum(S)`. The decoder
(`losses.sparse_decode`) is an `embedding_bag` over the selected rows with a sparse
decoder gradient, so its forward and backward are sparse as well.
No dense `[B, d_sae]` tensor is ever part of the autograd graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sae_atlas.saes.sae.losses import dead_topk, sparse_decode, sparse_rows_product


class _GatheredPre(torch.autograd.Function):
    """`pre[b, idx[b, j]]` as a differentiable function of (W_enc, b_enc, b_dec)."""

    @staticmethod
    def forward(ctx, W_enc, b_enc, b_dec, x_c, pre, idx, sub_b_dec):  # type: ignore[override]
        ctx.save_for_backward(W_enc, x_c, idx)
        ctx.sub_b_dec = sub_b_dec
        return pre.gather(1, idx)

    @staticmethod
    def backward(ctx, grad_BM):  # type: ignore[override]
        W_enc, x_c, idx = ctx.saved_tensors
        d_sae = W_enc.shape[1]
        grad_W_enc = grad_b_enc = grad_b_dec = None
        if ctx.needs_input_grad[0]:
            grad_W_enc = sparse_rows_product(idx, grad_BM, x_c, d_sae).t()
        colsum = torch.zeros(d_sae, dtype=W_enc.dtype, device=W_enc.device)
        colsum.index_add_(0, idx.reshape(-1), grad_BM.reshape(-1).to(W_enc.dtype))
        if ctx.needs_input_grad[1]:
            grad_b_enc = colsum
        if ctx.needs_input_grad[2] and ctx.sub_b_dec:
            grad_b_dec = -(W_enc @ colsum)
        return grad_W_enc, grad_b_enc, grad_b_dec, None, None, None, None


_WORKSPACE: dict[tuple, torch.Tensor] = {}


def _pre_buffer(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """A reused `[rows, cols]` scratch tensor for the dense pre-activations.

    Allocating ~75 MB afresh each step costs page faults (system time) on CPU; the buffer
    is only written and read inside `topk_sparse_forward`, never kept.
    """
    key = (rows, cols, like.dtype, like.device)
    if key not in _WORKSPACE:
        _WORKSPACE.clear()
        _WORKSPACE[key] = torch.empty(rows, cols, dtype=like.dtype, device=like.device)
    return _WORKSPACE[key]


class FastTopKOutput(NamedTuple):
    """Sparse results of one fast TopK forward pass."""

    x_hat: torch.Tensor  # [B, d_in]
    vals: torch.Tensor  # [B, k] relu'd top-k activations (differentiable)
    idx: torch.Tensor  # [B, k] their latent indices
    aux_vals: torch.Tensor | None  # [B, k_aux] dead-latent pre-activations (differentiable)
    aux_idx: torch.Tensor | None  # [B, k_aux]
    fired: torch.Tensor  # [d_sae] int64: tokens on which each latent fired


def topk_sparse_forward(
    sae: torch.nn.Module, x: torch.Tensor, dead_mask: torch.Tensor | None = None, k_aux: int = 0
) -> FastTopKOutput:
    """TopK encode + decode of `x [B, d_in]` whose backward touches only selected latents.

    Also selects the AuxK latents (top `k_aux` of the dead ones) from the same GEMM.
    Gradients equal those of the dense path `topk(relu(pre)) @ W_dec + b_dec`.
    """
    sae._check_input(x)
    k = sae.cfg.k
    sub = sae.cfg.apply_b_dec_to_input
    with torch.no_grad():
        x_c = x - sae.b_dec if sub else x
        pre = _pre_buffer(x.shape[0], sae.cfg.d_sae, sae.W_enc)
        torch.addmm(sae.b_enc, x_c, sae.W_enc, out=pre)
        idx = pre.topk(k, dim=1, sorted=False).indices
        aux_idx = dead_topk(pre, dead_mask, k_aux)
        all_idx = idx if aux_idx is None else torch.cat([idx, aux_idx], dim=1)
    gathered = _GatheredPre.apply(sae.W_enc, sae.b_enc, sae.b_dec, x_c, pre, all_idx, sub)
    del pre
    vals = gathered[:, :k].relu()
    x_hat = sparse_decode(vals, idx, sae.W_dec) + sae.b_dec
    with torch.no_grad():
        fired = torch.zeros(sae.cfg.d_sae, dtype=torch.int64, device=x.device)
        fired.index_add_(0, idx.reshape(-1), (vals > 0).reshape(-1).to(torch.int64))
    aux_vals = None if aux_idx is None else gathered[:, k:]
    return FastTopKOutput(x_hat, vals, idx, aux_vals, aux_idx, fired)
