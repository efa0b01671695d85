"""The built-in SAE architectures, registered by name, and `build_sae` for any registered one.

Adding an architecture: one `SAE` subclass (see `saes.sae.base`) and one
`register_architecture` line here.
"""

from __future__ import annotations

import torch

from sae_atlas.saes.sae.base import (
    SAE,
    SAEConfig,
    architecture_class,
    architecture_names,
    register_architecture,
)
from sae_atlas.saes.sae.batchtopk import BatchTopKSAE
from sae_atlas.saes.sae.jumprelu import JumpReLUSAE
from sae_atlas.saes.sae.losses import init_sae_weights
from sae_atlas.saes.sae.matryoshka import MatryoshkaSAE
from sae_atlas.saes.sae.standard import StandardSAE
from sae_atlas.saes.sae.topk import TopKSAE
from sae_atlas.store.dtypes import parse_dtype

register_architecture(StandardSAE)
register_architecture(TopKSAE)
register_architecture(BatchTopKSAE)
register_architecture(JumpReLUSAE)
register_architecture(MatryoshkaSAE)

ARCHITECTURES: tuple[str, ...] = architecture_names()  # the built-in ones


# The initial weights come from their own random stream: a generator seeded with the bare
# `cfg.seed` would draw the same Gaussian rows as any data made with that seed (a planted
# dictionary from `manual_seed(0)` would be the initial decoder, recovered without training).
INIT_STREAM = 0x5AE_1A17


def build_sae(cfg: SAEConfig) -> SAE:
    """A new SAE for `cfg`: unit-norm random decoder rows (seeded by `cfg.seed` on their own
    stream), encoder initialised to the decoder transpose, zero biases, architecture-specific extras
    (JumpReLU `log_threshold = log(jumprelu_init_threshold)`, BatchTopK threshold 0)."""
    sae = architecture_class(cfg.architecture)(cfg)
    generator = torch.Generator().manual_seed(INIT_STREAM + cfg.seed)
    init_sae_weights(sae, generator)
    return sae.to(parse_dtype(cfg.dtype))
