"""Training-loss pieces shared by the SAE architectures: step info, FVU, AuxK.

Every architecture's `training_loss(x, info, target)` returns a `TrainStep`: the scalar loss to
back-propagate, named scalar metrics (`mse`, `fvu`, `l0` and the auxiliaries), and how
often each latent fired in the batch (for the trainer's dead-latent counters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class StepInfo:
    """What a loss needs to know about the training run at this step."""

    step: int = 0
    total_steps: int = 1
    dead_mask: torch.Tensor | None = None  # [d_sae] bool: latents that count as dead
    k_aux: int = 0  # AuxK: how many dead latents reconstruct the residual
    aux_coefficient: float = 1.0 / 32.0
    # sum_d Var(x_d) of the training data, estimated once by the trainer. Losses divide the
    # squared error by it (a constant), so the loss stays a plain per-token mean and
    # data-parallel training equals single-process training; None: use the batch's.
    data_variance: float | None = None


@dataclass
class TrainStep:
    """Result of one training forward pass."""

    loss: torch.Tensor  # scalar, to back-propagate
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # detached scalars
    fired: torch.Tensor | None = None  # [d_sae] int64: tokens on which each latent fired


def total_variance(x_BD: torch.Tensor) -> torch.Tensor:
    """`sum_d Var(x_d)` over the batch (the FVU denominator), floored away from zero."""
    return (x_BD - x_BD.mean(0)).pow(2).sum(-1).mean().clamp_min(1e-12)


def variance_of(x_BD: torch.Tensor, info: StepInfo) -> torch.Tensor | float:
    """The FVU denominator: the run's `info.data_variance`, else the batch's."""
    return info.data_variance if info.data_variance is not None else total_variance(x_BD)


def normalised_error(x_BD: torch.Tensor, x_hat_BD: torch.Tensor, info: StepInfo) -> torch.Tensor:
    """`E_t||x - x_hat||^2 / sum_d Var(x_d)` (denominator from `variance_of`)."""
    return (x_BD - x_hat_BD).pow(2).sum(-1).mean() / variance_of(x_BD, info)


def step_metrics(
    x_BD: torch.Tensor, x_hat_BD: torch.Tensor, n_active_B: torch.Tensor, info: StepInfo
) -> dict[str, torch.Tensor]:
    """`mse` = E_t||x - x_hat||^2, `fvu` = mse / sum_d Var(x_d), `l0` = mean active latents.

    `fvu` is differentiable and is the loss of the TopK-family architectures.
    """
    mse = (x_BD - x_hat_BD).pow(2).sum(-1).mean()
    return {"mse": mse, "fvu": mse / variance_of(x_BD, info), "l0": n_active_B.float().mean()}


def sparse_rows_product(idx_BK: torch.Tensor, vals_BK: torch.Tensor, dense_BD: torch.Tensor, n_rows: int) -> torch.Tensor:
    """`S^T @ dense` for the sparse `S [B, n_rows]` with `S[b, idx[b, j]] = vals[b, j]`.

    The `[n_rows, D]` result costs `B * K * D` multiply-adds (a sparse-dense product);
    repeated (b, latent) pairs add up.
    """
    B, K = idx_BK.shape
    rows = torch.arange(B, device=idx_BK.device).repeat_interleave(K)
    S_FB = torch.sparse_coo_tensor(
        torch.stack([idx_BK.reshape(-1), rows]), vals_BK.reshape(-1).to(dense_BD.dtype),
        (n_rows, B), check_invariants=False,
    )
    return torch.sparse.mm(S_FB, dense_BD)


class _DecoderRowGrad(torch.autograd.Function):
    """Zero in the forward pass; in the backward pass the decoder gradient of a sparse
    decode, `grad W_dec = S^T @ grad_x_hat`, from the k selected rows per token only."""

    @staticmethod
    def forward(ctx, W_dec, vals, idx):  # type: ignore[override]
        ctx.save_for_backward(vals, idx)
        ctx.n_rows = W_dec.shape[0]
        return W_dec.new_zeros(idx.shape[0], W_dec.shape[1])

    @staticmethod
    def backward(ctx, grad_BD):  # type: ignore[override]
        vals, idx = ctx.saved_tensors
        return sparse_rows_product(idx, vals, grad_BD, ctx.n_rows), None, None


def sparse_decode(vals_BK: torch.Tensor, idx_BK: torch.Tensor, W_dec_FD: torch.Tensor) -> torch.Tensor:
    """`sum_j vals[b, j] * W_dec[idx[b, j]]` (no bias), forward and backward sparse.

    `embedding_bag` over a detached decoder gives the output and the gradient of `vals`;
    `_DecoderRowGrad` adds the decoder gradient as a sparse-dense product, which is much
    cheaper on CPU than `embedding_bag`'s dense weight backward (zero fill + sort).
    """
    out = F.embedding_bag(idx_BK, W_dec_FD.detach(), per_sample_weights=vals_BK, mode="sum")
    if W_dec_FD.requires_grad and torch.is_grad_enabled():
        out = out + _DecoderRowGrad.apply(W_dec_FD, vals_BK.detach(), idx_BK)
    return out


@torch.no_grad()
def dead_topk(pre_BF: torch.Tensor, dead_mask_F: torch.Tensor | None, k_aux: int) -> torch.Tensor | None:
    """Indices `[B, min(k_aux, n_dead)]` of the top `k_aux` dead latents per token by
    pre-activation (unsorted); None when no latent is dead or `k_aux` is 0."""
    if dead_mask_F is None or k_aux <= 0:
        return None
    dead_idx = dead_mask_F.nonzero().squeeze(1)
    k = min(k_aux, dead_idx.numel())
    if k == 0:
        return None
    local = pre_BF.index_select(1, dead_idx).topk(k, dim=1, sorted=False).indices
    return dead_idx[local]


def auxk_select(
    pre_BF: torch.Tensor, dead_mask_F: torch.Tensor | None, k_aux: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Pre-activations and indices `(vals, idx)` of the top `k_aux` dead latents per token
    (`dead_topk`; the values keep their gradient). None when there are none."""
    idx = dead_topk(pre_BF, dead_mask_F, k_aux)
    return None if idx is None else (pre_BF.gather(-1, idx), idx)


def auxk_loss(
    residual_BD: torch.Tensor, aux_vals_BK: torch.Tensor, aux_idx_BK: torch.Tensor, W_dec_FD: torch.Tensor
) -> torch.Tensor:
    """AuxK loss (Gao et al. 2024, "Scaling and evaluating sparse autoencoders").

    The dead latents' top-k_aux activations reconstruct the main model's residual
    `x - x_hat` (detached); the squared error is normalised by the residual's variance.
    """
    e_hat = sparse_decode(aux_vals_BK.relu(), aux_idx_BK, W_dec_FD)
    e = residual_BD.detach()
    return (e_hat - e).pow(2).sum(-1).mean() / total_variance(e)


def fired_counts(acts_BF: torch.Tensor) -> torch.Tensor:
    """`[d_sae]` int64: on how many tokens of the batch each latent was non-zero."""
    return (acts_BF != 0).sum(0)


def init_sae_weights(sae: torch.nn.Module, generator: torch.Generator) -> None:
    """Random unit-norm decoder rows, encoder = decoder transpose, zero biases. A
    transcoder's encoder (it reads another space than it writes) is drawn on its own, with
    unit-norm columns; its skip connection starts at zero."""
    with torch.no_grad():
        W_dec = torch.randn(sae.W_dec.shape, generator=generator, dtype=sae.W_dec.dtype)
        W_dec /= W_dec.norm(dim=-1, keepdim=True)
        sae.W_dec.copy_(W_dec)
        if sae.cfg.is_transcoder:
            W_enc = torch.randn(sae.W_enc.shape, generator=generator, dtype=sae.W_enc.dtype)
            sae.W_enc.copy_(W_enc / W_enc.norm(dim=0, keepdim=True))
        else:
            sae.W_enc.copy_(W_dec.T)
        if sae.cfg.skip:
            sae.W_skip.zero_()
        sae.b_enc.zero_()
        sae.b_dec.zero_()
