"""Autointerp scoring with the lexical proxy on planted single-token latents: sampling, the
true explanation scores high and a shuffled one near chance, delphi's metrics."""

import pytest

from sae_atlas.saes.eval.autointerp import sampled_latents
from sae_atlas.saes.eval.autointerp_backends import LexicalBackend, explanation_terms
from sae_atlas.saes.eval.autointerp_scoring import (
    SCORERS,
    Judgement,
    Sample,
    classification_scores,
    latent_examples,
    scorer_samples,
)
from tests.saes.autointerp_planted import PLANTED, planted_examples, planted_features


def examples_of(latent, frame, seed=0):
    return latent_examples(latent, frame.filter(frame["latent"] == latent), frame,
                           n_explain=8, n_activating=12, n_non_activating=12, seed=seed)


def test_sampling_splits_explainer_and_held_out_windows_by_quantile():
    frame = planted_examples()
    examples = examples_of(2, frame)
    assert len(examples.explain) == 8 and len(examples.activating) == 12 and len(examples.non_activating) == 12
    assert all(max(w.acts) >= 9.0 for w in examples.explain)  # the highest top examples
    assert {max(w.acts) for w in examples.activating} >= {1.0, 2.0, 3.0}  # every band is represented
    assert all(PLANTED[2] not in w.tokens and not any(w.acts) for w in examples.non_activating)
    assert examples_of(2, frame) == examples  # seeded
    assert examples_of(2, frame, seed=1) != examples


def test_sampled_latents_are_alive_seeded_and_capped():
    features, frame = planted_features(), planted_examples()
    dead = features.with_columns(n_active=features["n_active"].scatter(0, 0))
    chosen = sampled_latents(dead, frame, 3, seed=0)
    assert len(chosen) == 3 and 0 not in chosen and chosen == sorted(chosen)
    assert chosen == sampled_latents(dead, frame, 3, seed=0)
    assert sampled_latents(dead, frame, 99, seed=0) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("latent", range(len(PLANTED)))
def test_true_explanation_scores_high_and_a_shuffled_one_near_chance(latent):
    frame, backend = planted_examples(), LexicalBackend()
    examples = examples_of(latent, frame)
    explanation = backend.explain(examples.explain)
    assert explanation == f'fires on "{PLANTED[latent].strip()}"'
    shuffled = backend.explain(examples_of((latent + 1) % len(PLANTED), frame).explain)
    for scorer in SCORERS:
        samples = scorer_samples(scorer, examples, seed=0)
        assert sum(s.activating for s in samples) == 12 and len(samples) == 24
        true = classification_scores(samples, backend.judge(scorer, explanation, samples))
        assert true["balanced_accuracy"] >= 0.95 and true["f1"] >= 0.95 and true["auc"] >= 0.95
        wrong = classification_scores(samples, backend.judge(scorer, shuffled, samples))
        assert wrong["balanced_accuracy"] <= 0.6


def test_fuzzing_marks_firing_tokens_on_positives_and_borrowed_positions_on_negatives():
    examples = examples_of(0, planted_examples())
    samples = scorer_samples("fuzzing", examples, seed=0)
    for sample in samples:
        marked = [sample.tokens[i] for i in sample.highlighted]
        assert (marked == [PLANTED[0]]) == sample.activating
        assert len(sample.highlighted) == 1
    assert all(not s.highlighted for s in scorer_samples("detection", examples, seed=0))


def test_explanation_terms_are_the_quoted_strings_else_the_words():
    assert explanation_terms('fires on " Monday", "Friday" (after "on")') == {"monday", "friday", "on"}
    assert explanation_terms("Days of the week") == {"days", "of", "the", "week"}


def test_classification_scores_follow_delphi():
    samples = [Sample(("x",), (), truth) for truth in (True, True, True, False, False)]
    judgements = [Judgement(True, 0.9), Judgement(False, 0.4), Judgement(None), Judgement(True, 0.6),
                  Judgement(False, 0.1)]
    scores = classification_scores(samples, judgements)
    # read: 2 positives (1 tp, 1 fn), 2 negatives (1 fp, 1 tn); the unread one is left out
    assert scores["failed"] == 1
    assert scores["balanced_accuracy"] == pytest.approx(0.5)
    assert scores["precision"] == pytest.approx(0.5) and scores["recall"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx(0.5)
    assert scores["auc"] == pytest.approx(0.75)  # 3 of the 4 (positive, negative) pairs ordered
    without_probabilities = classification_scores(samples, [Judgement(j.prediction) for j in judgements])
    assert without_probabilities["auc"] is None and without_probabilities["balanced_accuracy"] == pytest.approx(0.5)
    none_predicted = classification_scores(samples[:2], [Judgement(False, 0.0), Judgement(False, 0.0)])
    assert none_predicted["f1"] == 0.0 and none_predicted["auc"] is None
