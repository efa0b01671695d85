"""Build an SAE of any architecture from its `SAEConfig`, with seeded initial weights."""

from __future__ import annotations

from typing import Literal

import torch

from saes.sae.base import SAE, SAEConfig
from saes.sae.batchtopk import BatchTopKSAE
from saes.sae.jumprelu import JumpReLUSAE
from saes.sae.losses import init_sae_weights
from saes.sae.matryoshka import MatryoshkaSAE
from saes.sae.standard import StandardSAE
from saes.sae.topk import TopKSAE
from store.dtypes import parse_dtype

Architecture = Literal["standard", "topk", "batchtopk", "jumprelu", "matryoshka"]
SAE_CLASSES: dict[Architecture, type[SAE]] = {
    "standard": StandardSAE,
    "topk": TopKSAE,
    "batchtopk": BatchTopKSAE,
    "jumprelu": JumpReLUSAE,
    "matryoshka": MatryoshkaSAE,
}


ARCHITECTURES: tuple[Architecture, ...] = tuple(SAE_CLASSES)  # the one list of architectures


# The initial weights come from their own random stream: a generator seeded with the bare
# `cfg.seed` would draw the same Gaussian rows as any data made with that seed (a planted
# dictionary from `manual_seed(0)` would be the initial decoder, recovered without training).
INIT_STREAM = 0x5AE_1A17


def sae_class(architecture: Architecture) -> type[SAE]:
    """The `SAE` subclass for an architecture name (config validation names the valid ones)."""
    return SAE_CLASSES[architecture]


def build_sae(cfg: SAEConfig) -> SAE:
    """A new SAE for `cfg`: unit-norm random decoder rows (seeded by `cfg.seed` on their own
    stream), encoder initialised to the decoder transpose, zero biases, architecture-specific extras
    (JumpReLU `log_threshold = log(jumprelu_init_threshold)`, BatchTopK threshold 0)."""
    sae = sae_class(cfg.architecture)(cfg)
    generator = torch.Generator().manual_seed(INIT_STREAM + cfg.seed)
    init_sae_weights(sae, generator)
    return sae.to(parse_dtype(cfg.dtype))
