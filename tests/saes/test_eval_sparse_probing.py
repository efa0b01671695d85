"""The sparse_probing eval on a tiny model: built-in labelled sets, a user .jsonl set, the
SAEBench layout of its result and the refusals of unusable probe files."""

import json

import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.probe_data import (
    code_vs_prose_set,
    file_probe_set,
    topic_families,
    topics_set,
)
from sae_atlas.saes.eval.results import read_result
from sae_atlas.saes.eval.sparse_probing import SparseProbingConfig, binary_tasks, with_probe_file
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread  # noqa: F401

HOOK = "blocks.1.hook_resid_post"


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import tiny_model

    root = tmp_path_factory.mktemp("atlas")
    handle = tiny_model(n_layers=2, d_model=32, seed=3)
    cache_activations(handle, root, [HOOK], corpus=CorpusSpec(context_size=16), n_tokens=16 * 8,
                      batch_blocks=8, shard_blocks=8, progress=False)
    save_saelens(build_sae(SAEConfig("topk", d_in=32, d_sae=64, k=4, hook_name=HOOK)), AtlasLayout(root).sae_dir("s"))
    return root, handle


def test_builtin_sets_are_labelled_offline():
    topics = topics_set(per_class=4, seed=0)
    assert topics.classes == sorted(topic_families()) and len(topics.texts) == 4 * len(topic_families())
    assert any("Monday" in t for t, label in zip(topics.texts, topics.labels, strict=True) if label == "weekday")
    code = code_vs_prose_set(per_class=5, seed=0)
    assert code.classes == ["code", "prose"] and code.labels.count("code") == 5 == code.labels.count("prose")
    assert all(text.startswith(("def ", "async def ")) for text, label in zip(code.texts, code.labels, strict=True)
               if label == "code")


def test_one_vs_rest_tasks_are_balanced_and_a_two_class_set_is_one_task():
    tasks = binary_tasks(["a"] * 3 + ["b"] * 5 + ["c"] * 9, seed=0)
    assert [cls for cls, _, _ in tasks] == ["a", "b", "c"]
    assert all(y.sum() * 2 == len(y) for _, _, y in tasks)
    assert [cls for cls, _, _ in binary_tasks(["x", "y", "x", "y"], seed=0)] == ["y"]


def test_probe_files_without_labels_or_with_one_class_are_refused(tmp_path):
    unlabelled = write_jsonl(tmp_path / "unlabelled.jsonl", [{"text": "hello there"}, {"text": "general"}])
    with pytest.raises(InvalidInputError, match=r"unlabelled.jsonl line 1 has no label field 'label' \(fields: text\)"):
        file_probe_set(unlabelled, "label")
    one_class = write_jsonl(tmp_path / "one.jsonl", [{"text": "a b", "topic": "x"}, {"text": "c d", "topic": "x"}])
    with pytest.raises(InvalidInputError, match=r"one.jsonl has fewer than two classes in label field 'topic' "
                                                r"\(found: 'x'\)"):
        with_probe_file(SparseProbingConfig(), one_class, "topic")
    with pytest.raises(InvalidInputError, match="does not exist"):
        file_probe_set(tmp_path / "nope.jsonl", "label")


def test_sparse_probing_result_in_saebench_layout(tiny, tmp_path):
    root, handle = tiny
    rows = [{"text": f"The {w} is here today.", "kind": "colour"} for w in ("red", "blue", "green", "yellow")]
    rows += [{"text": f"I ate the {w} quickly.", "kind": "fruit"} for w in ("apple", "pear", "grape", "lemon")]
    config = with_probe_file(SparseProbingConfig(per_class=6, max_tokens=24), write_jsonl(tmp_path / "mine.jsonl", rows),
                             "kind")
    done = run_suite(root, ["s"], ["sparse_probing"], {"sparse_probing": config}, device="cpu", model=lambda: handle,
                     progress=False)
    assert not done.failures, done.failures
    output = read_result(root, "s", "sparse_probing")
    assert output["eval_type_id"] == "sparse_probing"
    metrics = output["eval_result_metrics"]
    assert set(metrics["llm"]) == {"llm_test_accuracy", "llm_top_1_test_accuracy", "llm_top_2_test_accuracy",
                                   "llm_top_5_test_accuracy"}
    assert set(metrics["sae"]) == {key.replace("llm", "sae") for key in metrics["llm"]}
    assert all(0.0 <= v <= 1.0 for category in metrics.values() for v in category.values())
    assert [row["dataset_name"] for row in output["eval_result_details"]] == ["topics", "code_vs_prose", "mine"]
    assert set(output["eval_result_unstructured"]["mine"]) == {"fruit"}
    assert output["eval_config"]["label_field"] == "kind" and len(output["eval_config"]["probe_file_sha256"]) == 64
