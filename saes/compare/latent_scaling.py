"""Latent Scaling (Minder et al. 2025, "Overcoming sparsity artifacts in crosscoders to
interpret chat-tuning"): is a crosscoder's B-only latent really absent from model A, or only
made to look so by the L1 / sparsity pressure?

For latent `j` with activation `f_j(x)` and its own side's decoder row `d_j` (side B for a
B-only latent, side A for an A-only one), the scalar `beta` that best explains a target
`y(x)` as `beta f_j(x) d_j` in least squares over tokens is
`beta = sum_x f_j(x) <d_j, y(x)> / (||d_j||^2 sum_x f_j(x)^2)`. Four targets per latent, for
side `s` in {A, B}:

- error: `x_s - x_s' + f_j D_s[j]`, the crosscoder's reconstruction error of side `s` with
  latent `j` removed from the reconstruction (`beta_error_s`);
- reconstruction: `x_s'`, the crosscoder's reconstruction of side `s` (decoder bias
  included, as the crosscoder's decode returns it) (`beta_recon_s`).

The ratios put the other side over the latent's own side: for a B-only latent
`nu_error = beta_error_a / beta_error_b` and `nu_recon = beta_recon_a / beta_recon_b` (A over
B for an A-only one, swapped). Near 0: the latent's direction is absent from the other
model, a truly model-specific latent. A high `nu_error` flags Complete Shrinkage (the
other side's decoder row shrank to zero although its activations still carry the
direction, which then sits in its reconstruction error); a high `nu_recon` flags Latent
Decoupling (other latents reconstruct the direction on the other side at the same tokens).

Everything is a closed-form sum, streamed over token batches in bounded memory and batched
over latents: per latent `sum f^2`, the number of active tokens and, per target,
`sum f <d_j, .>` from one `[tokens, latents]` projection per batch. The decoder rows of both
sides must live in one space (`d_a == d_b`: the same hook of two fine-tunes of one model, or
two hooks of one model).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.sae.base import SAE

TARGETS = ("error", "recon")


@dataclass(frozen=True)
class LatentScaling:
    """Per scaled latent: its own side, the four betas, the two ratios and its firing count."""

    latents: np.ndarray  # [J] int indices into the crosscoder's latents
    own_side: np.ndarray  # [J] "a" or "b": whose decoder row is the latent's direction
    beta_error_a: np.ndarray  # [J]
    beta_error_b: np.ndarray  # [J]
    beta_recon_a: np.ndarray  # [J]
    beta_recon_b: np.ndarray  # [J]
    active_tokens: np.ndarray  # [J] tokens on which the latent fired

    def _ratio(self, target: str) -> np.ndarray:
        a, b = getattr(self, f"beta_{target}_a"), getattr(self, f"beta_{target}_b")
        own_b = self.own_side == "b"
        num, den = np.where(own_b, a, b), np.where(own_b, b, a)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)

    @property
    def nu_error(self) -> np.ndarray:
        """`beta_error(other side) / beta_error(own side)`: high = Complete Shrinkage."""
        return self._ratio("error")

    @property
    def nu_recon(self) -> np.ndarray:
        """`beta_recon(other side) / beta_recon(own side)`: high = Latent Decoupling."""
        return self._ratio("recon")

    def columns(self, d_sae: int) -> dict[str, np.ndarray]:
        """The per-latent columns over all `d_sae` latents (NaN / 0 for latents not scaled)."""
        out: dict[str, np.ndarray] = {}
        values = {"beta_error_a": self.beta_error_a, "beta_error_b": self.beta_error_b,
                  "beta_recon_a": self.beta_recon_a, "beta_recon_b": self.beta_recon_b,
                  "nu_error": self.nu_error, "nu_recon": self.nu_recon}
        for name, value in values.items():
            out[name] = np.full(d_sae, np.nan)
            out[name][self.latents] = value
        out["scaling_active_tokens"] = np.zeros(d_sae, dtype=np.int64)
        out["scaling_active_tokens"][self.latents] = self.active_tokens
        return out


class LatentScalingSums:
    """The running sums of Latent Scaling for chosen latents of a crosscoder whose rows put
    side A's `d_a` dims first; `update` with row batches as the crosscoder reads them (each
    side already scaled), then `result`."""

    def __init__(self, sae: SAE, d_a: int, latents: np.ndarray, own_side: np.ndarray) -> None:
        W = sae.W_dec.detach()
        if W.shape[1] != 2 * d_a:
            raise InvalidInputError(
                f"Latent Scaling needs both sides in one space (d_a == d_b); this crosscoder has d_a={d_a}, "
                f"d_b={W.shape[1] - d_a}")
        self.latents = np.asarray(latents, dtype=np.int64)
        self.own_side = np.asarray(own_side)
        if len(self.latents) != len(self.own_side) or not np.isin(self.own_side, ["a", "b"]).all():
            raise InvalidInputError("own_side must give 'a' or 'b' for every scaled latent")
        if len(self.latents) and not (0 <= self.latents.min() and self.latents.max() < W.shape[0]):
            raise InvalidInputError(f"latent indices must lie in [0, {W.shape[0]})")
        self.sae, self.d_a = sae, d_a
        idx = torch.as_tensor(self.latents)
        own_b = torch.as_tensor(self.own_side == "b").unsqueeze(1)
        W_J = W[idx].double()
        self.dec_a_JD, self.dec_b_JD = W_J[:, :d_a], W_J[:, d_a:]
        self.dirs_JD = torch.where(own_b, self.dec_b_JD, self.dec_a_JD)  # each latent's direction d_j
        J = len(self.latents)
        self.sum_f2 = torch.zeros(J, dtype=torch.float64)
        self.active = torch.zeros(J, dtype=torch.int64)
        self.num = {(t, s): torch.zeros(J, dtype=torch.float64) for t in TARGETS for s in ("a", "b")}

    @torch.no_grad()
    def update(self, rows_BD: torch.Tensor) -> None:
        """Add one batch of rows `[B, d_a + d_b]` (scaled as the crosscoder was trained)."""
        f_BF = sae_codes(self.sae, rows_BD)
        recon = self.sae.decode(f_BF).double().cpu()
        f_BJ = f_BF[:, torch.as_tensor(self.latents, device=f_BF.device)].double().cpu()
        x = rows_BD.to(f_BF.dtype).double().cpu()
        self.sum_f2 += (f_BJ**2).sum(0)
        self.active += (f_BJ > 0).sum(0)
        for side, cols in (("a", slice(None, self.d_a)), ("b", slice(self.d_a, None))):
            rec_BD = recon[:, cols]
            self.num["recon", side] += (f_BJ * (rec_BD @ self.dirs_JD.T)).sum(0)
            self.num["error", side] += (f_BJ * ((x[:, cols] - rec_BD) @ self.dirs_JD.T)).sum(0)

    def result(self) -> LatentScaling:
        """The betas: each numerator over `||d_j||^2 sum f_j^2` (NaN for a latent that never fired)."""
        norm2 = (self.dirs_JD**2).sum(1)
        den = norm2 * self.sum_f2
        betas = {}
        for side, dec_JD in (("a", self.dec_a_JD), ("b", self.dec_b_JD)):
            own_part = self.sum_f2 * (self.dirs_JD * dec_JD).sum(1)  # sum f_j^2 <d_j, D_s[j]>
            for target, num in (("error", self.num["error", side] + own_part), ("recon", self.num["recon", side])):
                betas[f"beta_{target}_{side}"] = torch.where(den > 0, num / den.clamp_min(1e-300),
                                                             torch.nan).numpy()
        return LatentScaling(self.latents, self.own_side, active_tokens=self.active.numpy(), **betas)


def latent_scaling(sae: SAE, d_a: int, batches: Iterable[torch.Tensor], latents: np.ndarray,
                   own_side: np.ndarray) -> LatentScaling:
    """Latent Scaling of `latents` (each with its own side, "a" or "b") of a crosscoder over
    row batches `[B, d_a + d_b]` already scaled as the crosscoder reads them."""
    sums = LatentScalingSums(sae, d_a, latents, own_side)
    for rows in batches:
        sums.update(rows)
    return sums.result()


def own_sides(relative_norm: np.ndarray) -> np.ndarray:
    """Each latent's own side from its relative decoder norm (`relative_norms`): "b" where
    `||D_B|| >= ||D_A||`, else "a" (a shared latent then scores nu ~ 1 on both ratios)."""
    return np.where(np.asarray(relative_norm) >= 0.5, "b", "a")
