"""Concept prompt sets, concept-token positions, activation collection and a planted-circle
intervention on a tiny model (offline)."""

import json

import numpy as np
import pytest
import torch

from sae_atlas.api.analyses.circular import (
    concept_spectra,
    replacements,
    run_circle_analysis,
    run_intervention,
    write_concept_run,
)
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.answers import answer_metrics, patched_logits
from sae_atlas.saes.intervene.concepts import (
    OrderedConcept,
    collect_concept_activations,
    concept_token_position,
    load_concept,
    months,
    tokenize_prompts,
    value_token_ids,
    weekdays,
)
from sae_atlas.saes.models import tiny_model


def test_builtin_prompt_sets():
    w = weekdays().prompts()
    assert len(w) == 49
    assert w[7].text == "Let's do some days of the week math. Two days from Monday is"
    assert (w[7].value, w[7].offset, w[7].answer) == (0, 2, 2)
    assert w[0].text.startswith("Let's do some days of the week math. One day from Monday")
    m = months().prompts()
    assert len(m) == 144
    march3 = [p for p in m if p.value == 2 and p.offset == 3][0]
    assert march3.text == "Let's do some calendar math. Three months from March is"
    assert march3.answer == 5
    for p in w + m:
        assert p.text[p.span[0] : p.span[1]] in weekdays().values + months().values


def test_user_concepts_and_validation(tmp_path):
    c = OrderedConcept("notes", ["do", "re", "mi", "fa"], ["sing {value} now", "{value}"])
    assert [p.text for p in c.prompts()][:5] == ["sing do now", "sing re now", "sing mi now", "sing fa now", "do"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(c.to_dict()))
    assert load_concept(str(path)).values == c.values
    assert load_concept("months").period == 12
    with pytest.raises(InvalidInputError, match="unknown concept"):
        load_concept("planets")
    with pytest.raises(InvalidInputError, match="exactly once"):
        OrderedConcept("x", ["a", "b", "c"], ["no slot"])
    with pytest.raises(InvalidInputError, match="offset"):
        OrderedConcept("x", ["a", "b", "c"], ["{offset} from {value}"])


def test_concept_token_position_uses_character_offsets():
    offsets = [(0, 3), (3, 4), (4, 9), (9, 12), (13, 15)]
    assert concept_token_position(offsets, (4, 12)) == 3  # the value spans tokens 2-3: last one
    assert concept_token_position(offsets, (13, 15)) == 4
    with pytest.raises(InvalidInputError, match="no token"):
        concept_token_position(offsets, (12, 13))


@pytest.fixture(scope="module")
def handle():
    return tiny_model(n_layers=4, d_model=32, seed=0)


def test_tokenize_finds_the_value_token_at_varying_positions(handle):
    c = OrderedConcept("days", ["monday", "tuesday", "wednesday"],
                       ["{value} is", "the cat sat on the mat on {value} and"])
    batch = tokenize_prompts(handle.tokenizer, c.prompts(), bos_token_id=handle.bos_token_id)
    assert batch.concept_pos.tolist() == [1, 1, 1, 8, 8, 8]
    for i, p in enumerate(batch.prompts):
        tok = handle.tokenizer.convert_ids_to_tokens(int(batch.tokens[i, batch.concept_pos[i]]))
        assert tok == c.values[p.value]
        assert int(batch.tokens[i, 0]) == handle.bos_token_id
    assert batch.final_pos.tolist() == [2, 2, 2, 9, 9, 9]


def test_collect_matches_a_direct_cached_run(handle):
    c = weekdays()
    batch = tokenize_prompts(handle.tokenizer, c.prompts()[:10], bos_token_id=handle.bos_token_id)
    got = collect_concept_activations(handle, batch, ["blocks.1.hook_resid_post"], batch_size=4)
    x = got["blocks.1.hook_resid_post"]
    assert x.shape == (10, 32)
    i = 3
    n = int(batch.lengths[i])
    _, cache = handle.bridge.run_with_cache(batch.tokens[i : i + 1, :n], names_filter=lambda h: h == "blocks.1.hook_resid_post")
    want = cache["blocks.1.hook_resid_post"][0, int(batch.concept_pos[i])]
    torch.testing.assert_close(x[i], want.float(), atol=1e-5, rtol=1e-5)


def test_answer_metrics():
    logits = torch.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 1.0]])
    m = answer_metrics(logits, torch.tensor([1, 0]), torch.tensor([2, 2]), [0, 1, 2])
    assert m.logit_diff_N.tolist() == [2.0, -1.0]
    assert m.accuracy == 0.5 and m.mean_logit_diff == 0.5


@pytest.fixture(scope="module")
def circle_model():
    """A tiny model whose weekday embeddings lie on a planted circle."""
    h = tiny_model(n_layers=4, d_model=32, seed=1)
    ids = value_token_ids(h.tokenizer, weekdays())
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(32, 2)))
    th = 2 * np.pi * np.arange(7) / 7
    circle = 0.5 * (np.cos(th)[:, None] * Q[:, 0] + np.sin(th)[:, None] * Q[:, 1])
    with torch.no_grad():
        h.bridge.W_E[ids] += torch.tensor(circle, dtype=torch.float32)
    return h


def test_planted_circle_is_found_and_intervention_moves_decoded_value(circle_model, tmp_path):
    h = circle_model
    analysis = run_circle_analysis(h, weekdays(), [1, 3])
    for ly in (1, 3):
        assert analysis.probes[ly].r2 > 0.9 and analysis.probes[ly].cyclic_order
    result = run_intervention(h, analysis, 1, shifts=[3], decode_layers=[1, 3])
    by = result.by_method()
    assert by["circle"]["decode_error_L3"] < 0.5  # lands on the target downstream
    assert by["circle"]["decode_error_L1"] < 0.5
    assert by["patch_layer"]["decode_error_L3"] < 0.5
    assert by["random_subspace"]["decode_error_L3"] > 1.5  # the value stays put
    assert by["mean_ablation"]["decode_error_L3"] > 1.0
    assert result.clean["decode_error_L3"] < 0.5
    assert {"mean_logit_diff", "delta_logit_diff", "accuracy"} <= set(result.table.columns)

    js = write_concept_run(tmp_path, "tiny-weekdays", analysis, result, model="tiny")
    meta = json.loads(js.read_text())
    assert meta["best_layer"] in (1, 3) and "created_with" in meta
    for name in meta["figures"].values():
        assert (js.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    spectra, groups = concept_spectra(analysis, 1)
    assert spectra.power_FK.shape == (32, 3)
    assert 7.0 in groups  # residual dimensions with period 7 (the planted circle)


def test_replacement_baselines_are_distinct(circle_model):
    analysis = run_circle_analysis(circle_model, weekdays(), [1])
    targets = (analysis.values + 1) % 7
    X = analysis.acts[1]
    reps = {m: replacements(analysis, 1, targets, m) for m in ("circle", "patch_layer", "random_subspace", "mean_ablation")}
    for m, R in reps.items():
        assert R.shape == X.shape and not np.allclose(R, X), m
    with pytest.raises(InvalidInputError, match="unknown intervention"):
        replacements(analysis, 1, targets, "bogus")


def test_patched_logits_change_only_with_a_patch(handle):
    batch = tokenize_prompts(handle.tokenizer, weekdays().prompts()[:6], bos_token_id=handle.bos_token_id)
    clean, _ = patched_logits(handle, batch)
    zeros = torch.zeros(6, 32)
    patched, caps = patched_logits(handle, batch, "blocks.0.hook_resid_post", zeros, capture=("blocks.0.hook_resid_post",))
    assert clean.shape == (6, handle.d_vocab)
    assert not torch.allclose(clean, patched)
    torch.testing.assert_close(caps["blocks.0.hook_resid_post"], zeros)
    with pytest.raises(InvalidInputError, match="shape"):
        patched_logits(handle, batch, "blocks.0.hook_resid_post", torch.zeros(5, 32))


def test_concept_cli_on_a_tiny_model(tmp_path):
    import typer
    from typer.testing import CliRunner

    from sae_atlas.api.commands.analyze_circular import register_analyze

    app, analyze = typer.Typer(), typer.Typer()
    app.add_typer(analyze, name="analyze")
    register_analyze(analyze)
    out = CliRunner().invoke(app, ["analyze", "circular", "concept", str(tmp_path), "--model", '{"kind": "tiny"}',
                                   "--layers", "1,2", "--intervene-layer", "1", "--shifts", "2",
                                   "--run", "t", "--spectra", "--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output[out.output.index("{"):])
    assert [r["layer"] for r in body["layers"]] == [1, 2]
    assert set(body["intervention"]["by_method"]) == {"circle", "patch_layer", "random_subspace", "mean_ablation"}
    assert body["spectra"]["period"] == 7 and body["spectra"]["layer"] in (1, 2)
    assert json.loads((tmp_path / "analyses" / "circular" / "t.json").read_text())["spectra"]
    assert (tmp_path / "analyses" / "circular" / "t.probe.png").exists()
    bad = CliRunner().invoke(app, ["analyze", "circular", "concept", "--model", '{"kind": "tiny"}',
                                   "--layers", "99"])
    assert bad.exit_code == 2 and "unknown hook" in bad.output
