"""SAE feature activations at a concept's tokens: render the concept's prompts, run the
model once per batch capturing every SAE's hook at the concept token
(`saes.intervene.concepts`), and encode each hook's activations with its SAEs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.intervene.concepts import (
    CategoryConcept,
    OrderedConcept,
    collect_concept_activations,
    tokenize_prompts,
)
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE


@dataclass
class ConceptActivations:
    """Per prompt: its value; per hook, the residual `[N, d]`; per SAE, the features `[N, F]`."""

    values_N: np.ndarray
    residual: dict[str, np.ndarray]
    features: dict[str, np.ndarray]
    texts: list[str]


def concept_feature_acts(
    handle: ModelHandle, saes: Mapping[str, SAE], hooks: Mapping[str, str], concept: OrderedConcept | CategoryConcept,
    *, extra_hooks: Sequence[str] = (), batch_size: int = 64,
) -> ConceptActivations:
    """Activations at the concept token of every prompt of `concept` for `saes` (an id to a
    loaded SAE; `hooks` the id to its hook), and the residual at `extra_hooks` as well."""
    prompts = concept.prompts()
    batch = tokenize_prompts(handle.tokenizer, prompts, bos_token_id=handle.bos_token_id)
    capture = sorted({hooks[s] for s in saes} | set(extra_hooks))
    residual = collect_concept_activations(handle, batch, capture, batch_size=batch_size)
    features = {}
    with torch.inference_mode():
        for sid, sae in saes.items():
            features[sid] = sae_codes(sae, residual[hooks[sid]]).float().cpu().numpy()
    return ConceptActivations(batch.values.numpy(), {h: x.numpy() for h, x in residual.items()}, features,
                              [p.text for p in prompts])
