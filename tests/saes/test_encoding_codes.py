"""`sae_codes`, the one way to encode: inputs take the dictionary's dtype and device, the
autograd graph is kept, and a CLT layer encodes like an SAE."""

import torch

from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig


def test_inputs_take_the_sae_dtype():
    torch.manual_seed(0)
    sae = build_sae(SAEConfig("standard", 8, 16, dtype="bfloat16")).eval()
    x = torch.randn(5, 8, dtype=torch.float64)
    codes = sae_codes(sae, x)
    assert codes.dtype == torch.bfloat16 and codes.shape == (5, 16)
    assert torch.equal(codes, sae.encode(x.to(torch.bfloat16)))


def test_the_graph_is_kept_for_gradients():
    sae = build_sae(SAEConfig("standard", 8, 16)).eval()
    x = torch.randn(3, 8, requires_grad=True)
    sae_codes(sae, x).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
