"""Circular features on the real SmolLM2-135M (slow: loads the model; few layers, batched)."""

import numpy as np
import pytest

from sae_atlas.api.analyses.circular import run_circle_analysis, run_intervention
from sae_atlas.saes.intervene.concepts import months, weekdays

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from sae_atlas.saes.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def weekday_analysis(smollm2):
    return run_circle_analysis(smollm2, weekdays(), [3, 8, 15])


def test_weekdays_lie_on_a_circle_in_cyclic_order(weekday_analysis):
    best = weekday_analysis.best_layer
    probe = weekday_analysis.probes[best]
    print("weekdays", weekday_analysis.table().select("layer", "r2", "r2_loo", "r2_null", "cyclic_order", "fitted_period"))
    assert probe.cyclic_order and probe.r2 > 0.9
    assert abs(probe.fitted_period - 7) < 1.0 and probe.period_fit > 0.9  # SmolLM2: ~7.7
    assert all(p.cyclic_order for p in weekday_analysis.probes.values())


def test_months_lie_on_a_circle_in_cyclic_order(smollm2):
    analysis = run_circle_analysis(smollm2, months(), [5, 12])
    probe = analysis.probes[analysis.best_layer]
    print("months", analysis.table().select("layer", "r2", "r2_loo", "r2_null", "cyclic_order", "fitted_period"))
    assert probe.cyclic_order and probe.r2 > 0.9
    assert abs(probe.fitted_period - 12) < 1.5 and probe.period_fit > 0.9


def test_circle_intervention_beats_a_random_subspace(smollm2, weekday_analysis):
    result = run_intervention(smollm2, weekday_analysis, 3, shifts=[3],
                              methods=("circle", "random_subspace"), seed=0)
    by = result.by_method()
    print("intervention", result.table)
    assert by["circle"]["delta_logit_diff"] > 0
    assert by["circle"]["delta_logit_diff"] > by["random_subspace"]["delta_logit_diff"] + 0.01
    assert np.isfinite(result.table["accuracy"].to_numpy()).all()
