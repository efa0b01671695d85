"""Concept search for weekdays on the real SmolLM2-135M (slow: loads the model, caches a
few thousand tokens of the built-in concept text at layer 8 and trains a small TopK SAE
on them, then searches it): a small group of features spans a cyclic period-~7 subspace.

(About 4 minutes on the shared 2-core machine at load average 8; most of it is the model
pass over ~5800 tokens and 300 training steps. With 40 documents and 200 steps the
fitted period drifted to 8.1, so the sizes are not cut further.)"""

import random

import numpy as np
import pytest
import torch

from sae_atlas.geometry.concept_search import search_concept
from sae_atlas.saes.builtin_text import concept_document
from sae_atlas.saes.encoding.texts import tokenize_texts
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.intervene.concept_codes import concept_feature_acts
from sae_atlas.saes.intervene.concepts import weekdays
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.trainer import train_sae

pytestmark = pytest.mark.slow
HOOK = "blocks.8.hook_resid_post"  # a middle layer (of 30)
N_DOCS, BATCH, STEPS = 60, 256, 300


@pytest.fixture(scope="module")
def smollm2():
    from sae_atlas.saes.models import load_model

    return load_model("smollm2-135m")


def _residuals(handle) -> torch.Tensor:
    """Layer-8 residuals of every non-BOS token of seeded built-in concept documents."""
    rng = random.Random(0)
    tokens, lengths = tokenize_texts(handle, [concept_document(rng, 12) for _ in range(N_DOCS)])
    rows = []
    for start in range(0, N_DOCS, 16):
        width = int(lengths[start:start + 16].max())
        acts = run_hooks(handle, tokens[start:start + 16, :width], [HOOK])[HOOK]
        rows.extend(acts[i, 1:int(n)] for i, n in enumerate(lengths[start:start + 16]))
    return torch.cat(rows).float()


def test_weekdays_span_a_small_cyclic_period_7_feature_group(smollm2):
    X = _residuals(smollm2)
    generator = torch.Generator().manual_seed(0)

    def batches(skip: int):
        while True:
            order = torch.randperm(len(X), generator=generator)
            for start in range(0, len(X) - BATCH + 1, BATCH):
                yield X[order[start:start + BATCH]]

    cfg = SAEConfig(architecture="topk", d_in=smollm2.d_model, d_sae=1024, k=16, hook_name=HOOK, seed=0)
    sae = train_sae(cfg, batches, TrainConfig(total_tokens=BATCH * STEPS, batch_size=BATCH, progress=False,
                                              checkpoint_every_tokens=0)).sae.eval()
    acts = concept_feature_acts(smollm2, {"sae": sae}, {"sae": HOOK}, weekdays())
    fit = search_concept(acts.residual[HOOK], acts.features["sae"], acts.values_N, sae.W_dec.detach().numpy(),
                         "ordered", 7, min_selectivity=0.5)
    print("weekdays span", fit.span.latents, np.round(fit.span.explained, 3), {k: fit.fit.get(k) for k in (
        "r2", "r2_loo", "cyclic_order", "fitted_period", "period_fit")}, "selective", int(fit.features["selective"].sum()))
    assert 2 <= len(fit.span.latents) <= 8
    assert set(fit.span.latents) <= set(fit.features.filter(fit.features["selective"])["latent"].to_list())
    assert fit.fit["cyclic_order"] and fit.fit["r2_loo"] > 0.8
    assert abs(fit.fit["fitted_period"] - 7) < 1.0 and fit.fit["period_fit"] > 0.9  # SmolLM2: ~7.7
