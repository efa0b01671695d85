"""The scr and tpp evals on a tiny model through the suite: the built-in profession x
gender set, SAEBench's layout and metric names of both results, the refusals."""

import re

import pytest

from sae_atlas.saes.eval.results import read_result
from sae_atlas.saes.eval.scr_tpp import ScrTppConfig, profession_gender_texts
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread  # noqa: F401

HOOK = "blocks.1.hook_resid_post"
CONFIG = ScrTppConfig(per_group=8, max_tokens=24)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas")
    save_saelens(build_sae(SAEConfig("topk", d_in=32, d_sae=64, k=4, hook_name=HOOK)), AtlasLayout(root).sae_dir("s"))
    return root, tiny_model(n_layers=2, d_model=32, seed=3)


def test_profession_gender_sentences_cover_every_group_with_matching_pronouns():
    texts, professor, male = profession_gender_texts(per_group=5, seed=0)
    assert len(texts) == 20 and professor.sum() == 10 and male.sum() == 10
    assert all(("professor" in t.lower() or "lectures" in t or "teaches" in t) == p
               for t, p in zip(texts, professor, strict=True))
    words = [set(re.findall(r"[a-z]+", t.lower())) for t in texts]
    assert all(bool(w & {"she", "her"}) != m and bool(w & {"he", "his", "him"}) == m
               for w, m in zip(words, male, strict=True))
    assert profession_gender_texts(per_group=5, seed=0)[0] == texts


def test_scr_and_tpp_results_in_saebench_layout(tiny):
    root, handle = tiny
    done = run_suite(root, ["s"], ["scr", "tpp"], {"scr": CONFIG, "tpp": CONFIG}, device="cpu", model=lambda: handle,
                     progress=False)
    assert not done.failures, done.failures
    n_values = CONFIG.n_values
    scr = read_result(root, "s", "scr")
    assert scr["eval_type_id"] == "scr" and scr["eval_config"]["n_values"] == list(n_values)
    assert set(scr["eval_result_metrics"]) == {"scr_metrics"}
    assert set(scr["eval_result_metrics"]["scr_metrics"]) == {
        f"scr_{kind}_threshold_{n}" for kind in ("dir1", "dir2", "metric") for n in n_values}
    assert [row["dataset_name"] for row in scr["eval_result_details"]] == ["profession_gender"]
    assert set(scr["eval_result_unstructured"]["profession_gender"]) == {
        "clean_label", "clean_spurious", "biased_on_label", "biased_on_spurious"}
    tpp = read_result(root, "s", "tpp")
    metrics = tpp["eval_result_metrics"]["tpp_metrics"]
    assert set(metrics) == {f"tpp_threshold_{n}_{kind}" for n in n_values
                            for kind in ("total_metric", "intended_diff_only", "unintended_diff_only")}
    assert all(-1.0 <= value <= 1.0 for value in metrics.values())
    assert [row["dataset_name"] for row in tpp["eval_result_details"]] == ["topics"]
    assert "weekday" in tpp["eval_result_unstructured"]["topics"]


def test_a_model_of_another_width_and_too_few_texts_are_refused_by_name(tiny):
    root, _ = tiny
    other = tiny_model(n_layers=2, d_model=16, seed=3)
    done = run_suite(root, ["s"], ["tpp"], {"tpp": CONFIG}, device="cpu", model=lambda: other, progress=False,
                     force=True)
    assert "has d_in=32 but" in done.failures[("s", "tpp")]
    done = run_suite(root, ["s"], ["scr"], {"scr": ScrTppConfig(per_group=2)}, device="cpu", model=lambda: other,
                     progress=False, force=True)
    assert "per_group must be at least 3" in done.failures[("s", "scr")]
