"""The guard's diagnoses on planted activations: an SAE that is exact on one distribution
is judged on another and the named cause must be the planted one."""

from __future__ import annotations

import torch

from sae_atlas.saes.importing.guard import check_sae
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.reconstruction import reconstruction_metrics

D = 8


def _relu_pair_sae(mean: torch.Tensor, apply_b_dec: bool = True):
    """A standard SAE that reconstructs anything exactly: latents +e_i and -e_i around `mean`."""
    sae = build_sae(SAEConfig(architecture="standard", d_in=D, d_sae=2 * D, apply_b_dec_to_input=apply_b_dec))
    eye = torch.eye(D)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_dec.copy_(mean)
        sae.b_enc.copy_(torch.zeros(2 * D) if apply_b_dec else torch.cat([-mean, mean]))
    return sae.eval()


def _rows(mean: float, scale: float, seed: int) -> torch.Tensor:
    return mean + scale * torch.randn(2048, D, generator=torch.Generator().manual_seed(seed))


def _causes(sae, rows, **kwargs) -> list[str]:
    metrics = reconstruction_metrics(sae, [rows])
    return [p.cause for p in check_sae(sae, rows, metrics, hook="blocks.0.hook_resid_post", **kwargs)]


def test_exact_sae_passes() -> None:
    rows = _rows(5.0, 1.0, 0)
    assert _causes(_relu_pair_sae(torch.full((D,), 5.0)), rows) == []


def test_wrong_hook_is_named_from_the_hook_it_fits() -> None:
    sae = _relu_pair_sae(torch.zeros(D))
    with torch.no_grad():  # a dictionary for the first half of the dimensions only
        sae.W_enc[D // 2:] = 0
        sae.W_dec[:, D // 2:] = 0
    there = _rows(0.0, 1.0, 1) * (torch.arange(D) < D // 2)  # lives in the first half
    here = 3.0 + _rows(0.0, 1.0, 2) * (torch.arange(D) >= D // 2)  # lives elsewhere, with a mean
    assert _causes(sae, there) == []
    assert _causes(sae, here) == ["fvu"]  # no other hook to compare with: the generic cause
    assert _causes(sae, here, other_hooks={"blocks.1.hook_resid_post": there}) == ["hook"]


def test_normalisation_is_named() -> None:
    rows = _rows(1.0, 1.0, 4)
    sae = _relu_pair_sae(torch.full((D,), 8.0))  # for inputs scaled by 8 (mean 8, std 8)
    with torch.no_grad():  # a dead zone of 2 around the mean: small next to std 8, not next to 1
        sae.b_enc.fill_(-2.0)
    assert _causes(sae, 8 * rows) == []
    assert _causes(sae, rows) == ["normalisation"]


def test_input_bias_convention_is_named() -> None:
    mean = torch.full((D,), 4.0)
    rows = _rows(4.0, 1.0, 3)
    right = _relu_pair_sae(mean, apply_b_dec=False)
    assert _causes(right, rows) == []
    wrong = _relu_pair_sae(mean, apply_b_dec=False)
    wrong.cfg.apply_b_dec_to_input = True  # read with the other convention: pre shifted by -mean twice
    assert _causes(wrong, rows) == ["apply_b_dec_to_input"]
