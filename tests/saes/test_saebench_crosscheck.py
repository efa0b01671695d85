"""Our core and sparse-probing evals agree with SAEBench's own numbers on the same inputs.

`tests/fixtures/saebench/` holds a tiny GPT-NeoX, a TopK SAE in SAELens format, the core
token blocks and labelled texts, and the outputs SAEBench 0.6.0 wrote for them
(regenerate all with `python -m bench.saebench`). These tests recompute our numbers and
check each SAEBench metric against its mapped one within the tolerance `bench.saebench.ours`
states (no SAEBench install, no network).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bench.saebench.ours import (
    CORE_DOWNSTREAM_CONVENTION,
    CORE_SAME,
    Check,
    Fixture,
    core_checks,
    sparse_probing_checks,
    table,
)
from sae_atlas.saes.sae.architectures import build_sae

# SAEBench core metrics with no counterpart among ours (reported by SAEBench only).
CORE_UNMAPPED = {"reconstruction_quality.explained_variance_legacy", "misc_metrics.freq_over_1_percent",
                 "misc_metrics.normalized_freq_over_1_percent", "misc_metrics.normalized_freq_over_10_percent",
                 "misc_metrics.average_max_encoder_cosine_sim", "misc_metrics.average_max_decoder_cosine_sim"}


@pytest.fixture(scope="module")
def fx() -> Fixture:
    torch.set_num_threads(2)
    return Fixture.load()


@pytest.fixture(scope="module")
def core(fx: Fixture) -> list[Check]:
    return core_checks(fx)


def test_core_metrics_match_saebench(fx: Fixture, core: list[Check]) -> None:
    checks = core
    assert all(c.ok for c in checks), table(checks)
    saebench = {f"{cat}.{name}" for cat, metrics in fx.saebench_core["eval_result_metrics"].items() for name in metrics}
    assert {c.metric for c in checks} == saebench - CORE_UNMAPPED  # every mappable metric, one check each
    assert len(checks) == len({c.metric for c in checks})


def test_core_convention_differences_are_real(core: list[Check]) -> None:
    """The 'convention' metrics differ from ours as documented (else they would be 'same')."""
    checks = {c.metric: c for c in core}
    for key in (*CORE_DOWNSTREAM_CONVENTION[:1], "reconstruction_quality.explained_variance",
                "reconstruction_quality.mse", "token_stats.total_tokens_eval_reconstruction"):
        check = checks[key]
        assert check.relation == "convention"
        assert abs(check.ours - check.saebench) > 3 * check.tolerance, key


def test_sparse_probing_matches_saebench(fx: Fixture) -> None:
    checks = sparse_probing_checks(fx)
    assert all(c.ok for c in checks), table(checks)
    saebench = fx.saebench_sparse_probing["eval_result_metrics"]
    expected = {f"{basis}.{name}" for basis, metrics in saebench.items() for name, v in metrics.items() if v is not None}
    assert {c.metric for c in checks[1:]} == expected


def test_a_changed_sae_fails_the_crosscheck(fx: Fixture) -> None:
    """Decoder rows scaled by 1% move the 'same' output-size metrics out of tolerance."""
    changed = build_sae(fx.sae.cfg)
    state = {k: v.clone() for k, v in fx.sae.state_dict().items()}
    state["W_dec"] *= 1.01
    changed.load_state_dict(state)
    checks = {c.metric: c for c in core_checks(dataclasses.replace(fx, sae=changed.eval()))}
    for key in ("shrinkage.l2_norm_out", "shrinkage.l2_ratio", "shrinkage.relative_reconstruction_bias"):
        assert key in CORE_SAME and not checks[key].ok, key
    assert checks["sparsity.l0"].ok  # the encoder is untouched


def test_fixture_outputs_were_written_by_saebench(fx: Fixture) -> None:
    for output in (fx.saebench_core, fx.saebench_sparse_probing):
        assert output["sae_lens_version"] == "6.54.12"
        assert output["sae_cfg_dict"]["d_sae"] == fx.sae.cfg.d_sae
    assert fx.saebench_core["eval_type_id"] == "core"
    assert fx.saebench_sparse_probing["eval_type_id"] == "sparse_probing"
    assert json.loads((fx.folder / "sae" / "cfg.json").read_text())["metadata"]["hook_name"] == fx.sae.cfg.hook_name
