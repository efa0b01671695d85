"""Lenses on a tiny model: the logit lens reads the model's own logits at the last layer,
and a tuned lens fitted on one split beats it in KL at the early layers of another."""

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.depth.lens import (
    LensScores,
    TunedLensFitter,
    logit_lens,
    next_token_rows,
    score_lenses,
)
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import tiny_model

N_LAYERS = 4


@pytest.fixture(scope="module")
def handle():
    return tiny_model(arch="llama", n_layers=N_LAYERS, seed=3)


def layer_acts(handle, tokens):
    hooks = [f"blocks.{i}.hook_resid_post" for i in range(N_LAYERS)]
    acts = run_hooks(handle, tokens, hooks)
    return {i: acts[h] for i, h in enumerate(hooks)}


def random_tokens(handle, n, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, handle.d_vocab, (n, T), generator=g)


def test_logit_lens_at_last_layer_is_the_model_output(handle):
    tokens = random_tokens(handle, 2, 12, 0)
    acts = layer_acts(handle, tokens)
    with torch.inference_mode():
        out = handle.bridge(tokens.to(handle.device)).float()
    assert torch.allclose(logit_lens(handle, acts[N_LAYERS - 1]), out, atol=1e-4)


def test_tuned_lens_beats_logit_lens_at_early_layers(handle):
    fitter, halves = TunedLensFitter(), [TunedLensFitter(), TunedLensFitter()]
    for seed in range(4):  # fitting split: 4 batches of 16 x 32 tokens
        tokens = random_tokens(handle, 16, 32, seed)
        rows, _ = next_token_rows(layer_acts(handle, tokens), tokens)
        fitter.update(rows, rows[N_LAYERS - 1])
        halves[seed % 2].update(rows, rows[N_LAYERS - 1])
    tuned = fitter.fit()
    halves[0].merge(halves[1])  # ranks' sums merge exactly
    merged = halves[0].fit()
    assert all(torch.allclose(merged.maps[k], tuned.maps[k], atol=1e-8) for k in tuned.maps)
    assert tuned.fit_loss[N_LAYERS - 1] < 1e-4 and tuned.fit_loss[0] > tuned.fit_loss[N_LAYERS - 1]

    scores = LensScores()
    tokens = random_tokens(handle, 16, 32, 99)  # held-out split
    rows, next_ids = next_token_rows(layer_acts(handle, tokens), tokens)
    score_lenses(handle, rows, next_ids, scores, tuned)
    table = {(r["lens"], r["layer"]): r for r in scores.table()}
    assert len(table) == 2 * N_LAYERS and table["logit", 0]["n_tokens"] == 16 * 31
    for layer in (0, 1):
        assert table["tuned", layer]["kl"] < table["logit", layer]["kl"]
    last = table["logit", N_LAYERS - 1]
    assert last["top1_agreement"] == 1.0 and last["kl"] == pytest.approx(0.0, abs=1e-5)
    assert table["tuned", N_LAYERS - 1]["top1_agreement"] > 0.95


def test_lens_input_errors(handle):
    with pytest.raises(InvalidInputError, match="last layer"):
        score_lenses(handle, {0: torch.zeros(2, handle.d_model)}, torch.zeros(2, dtype=torch.long), LensScores())
    with pytest.raises(InvalidInputError, match="fitting tokens"):
        TunedLensFitter().fit()
