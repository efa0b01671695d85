"""SAEBench's hub probing sets by name: each recipe reads SAEBench's columns, chosen classes
and balance from rows in the hub datasets' schema (a stand-in loader: tests have no
network), and a hub that does not answer is refused by name."""

import itertools

import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.hub_probe_sets import SAEBENCH_HUB_SETS, hub_probe_set
from sae_atlas.saes.eval.sparse_probing import SparseProbingConfig, with_datasets


def stream_of(rows_by_config):
    calls = []

    def load(dataset, config):
        calls.append((dataset, config))
        return iter(rows_by_config[config])
    return load, calls


def test_bias_in_bios_keeps_the_set_s_professions_balanced_by_gender():
    rows = [{"hard_text": f"bio {i}", "profession": i % 30, "gender": (i // 30) % 2} for i in range(3000)]
    load, calls = stream_of({None: rows})
    texts, labels = hub_probe_set("LabHC/bias_in_bios_class_set3", 8, 0, rows=load)
    assert calls == [("LabHC/bias_in_bios", None)]
    assert sorted(set(labels)) == sorted(["20", "21", "22", "25", "26"]) and len(texts) == 40
    by_text = {row["hard_text"]: row for row in rows}
    for cls in set(labels):
        genders = [by_text[t]["gender"] for t, label in zip(texts, labels, strict=True) if label == cls]
        assert sorted(genders) == [0] * 4 + [1] * 4
        assert all(by_text[t]["profession"] == int(label) for t, label in zip(texts, labels, strict=True))


def test_amazon_sentiment_and_ag_news_read_their_label_columns():
    reviews = [{"text": f"review {i}", "category": i % 7, "rating": 1.0 if i % 3 else 5.0} for i in range(200)]
    texts, labels = hub_probe_set("canrager/amazon_reviews_mcauley_1and5_sentiment", 5, 0,
                                  rows=stream_of({None: reviews})[0])
    assert labels.count("1.0") == 5 == labels.count("5.0")
    news = [{"text": f"news {i}", "label": i % 4} for i in range(100)]
    texts, labels = hub_probe_set("fancyzhx/ag_news", 3, 0, rows=stream_of({None: news})[0])
    assert labels == [c for c in ("0", "1", "2", "3") for _ in range(3)]
    assert all(int(t.split()[1]) % 4 == int(label) for t, label in zip(texts, labels, strict=True))


def test_europarl_takes_each_language_from_its_pair_and_code_skips_the_licence_header():
    pairs = {pair: [{"translation": {a: f"{a} text {i}", b: f"{b} text {i}"}} for i in range(10)]
             for pair in ("en-fr", "fr-it", "de-en", "es-fr", "nl-pt") for a, b in [pair.split("-")]}
    load, calls = stream_of(pairs)
    texts, labels = hub_probe_set("Helsinki-NLP/europarl", 4, 0, rows=load)
    assert [config for _, config in calls] == ["en-fr", "fr-it", "de-en", "es-fr", "nl-pt"]
    assert all(text.startswith(label + " ") for text, label in zip(texts, labels, strict=True))
    assert sorted(set(labels)) == ["de", "en", "es", "fr", "nl"]
    files = [{"code": "#" * 150 + "x" * n, "language": lang}
             for n, lang in itertools.product((100, 500), ("C", "Python", "HTML", "Java", "PHP", "Rust"))]
    texts, labels = hub_probe_set("codeparrot/github-code", 2, 0, rows=stream_of({None: files * 2})[0])
    assert "Rust" not in labels and all(text == "x" * 500 for text in texts)


def test_a_hub_that_does_not_answer_or_lacks_a_class_is_refused_by_name():
    def offline(dataset, config):
        raise ConnectionError("Couldn't reach the Hugging Face Hub")
    with pytest.raises(InvalidInputError, match=r"fancyzhx/ag_news.*could not be loaded.*ConnectionError.*--probe-data"):
        hub_probe_set("fancyzhx/ag_news", 4, 0, rows=offline)
    news = [{"text": f"news {i}", "label": i % 3} for i in range(60)]
    with pytest.raises(InvalidInputError, match=r"classes \{'3': 0\} have fewer than two texts"):
        hub_probe_set("fancyzhx/ag_news", 4, 0, rows=stream_of({None: news})[0])


def test_set_names_are_checked_before_anything_runs():
    config = with_datasets(SparseProbingConfig(), ["topics", "fancyzhx/ag_news"], per_class=64)
    assert config.datasets == ("topics", "fancyzhx/ag_news") and config.per_class == 64
    with pytest.raises(InvalidInputError, match=r"unknown probe set 'ag_news'; valid: topics, code_vs_prose, "
                                                r"LabHC/bias_in_bios_class_set1"):
        with_datasets(SparseProbingConfig(), ["ag_news"])
    assert len(SAEBENCH_HUB_SETS) == 8


def test_an_unreachable_hub_is_asked_once_without_retries(monkeypatch, capfd):
    """Offline the set is refused after one request to the hub, never after the dataset
    client's retries with backoff (nothing is streamed)."""
    import datasets
    import huggingface_hub.constants
    from huggingface_hub import HfApi

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    asked = []
    real = HfApi.dataset_info

    def counted(self, repo_id, **kwargs):
        asked.append(repo_id)
        return real(self, repo_id, **kwargs)

    def streamed(*args, **kwargs):
        raise AssertionError("the dataset was streamed though the hub did not answer")

    monkeypatch.setattr(HfApi, "dataset_info", counted)
    monkeypatch.setattr(datasets, "load_dataset", streamed)
    with pytest.raises(InvalidInputError, match=r"probe set 'fancyzhx/ag_news'.*could not be loaded.*--probe-data"
                       ) as refused:
        hub_probe_set("fancyzhx/ag_news", 4, 0)
    assert asked == ["fancyzhx/ag_news"] and "OfflineModeIsEnabled" not in str(refused.value)  # it asked
    out, err = capfd.readouterr()
    assert "Retry" not in out + err


def test_cli_eval_with_a_hub_set_offline_prints_one_error(tmp_path, capfd):
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app
    from sae_atlas.saes.formats import save_saelens
    from sae_atlas.saes.sae.architectures import build_sae
    from sae_atlas.saes.sae.base import SAEConfig
    from sae_atlas.store.layout import AtlasLayout

    layout = AtlasLayout(tmp_path / "atlas")
    layout.update_meta(model={"kind": "tiny"})
    save_saelens(build_sae(SAEConfig("topk", d_in=8, d_sae=16, k=2, hook_name="blocks.0.hook_resid_post")),
                 layout.sae_dir("s"))
    result = CliRunner().invoke(app, ["eval", str(layout.root), "--suite", "sparse_probing",
                                      "--probe-set", "fancyzhx/ag_news"])  # tests run with HF_HUB_OFFLINE=1
    assert result.exit_code == 2, result.output
    assert "probe set 'fancyzhx/ag_news'" in result.output and "--probe-data" in result.output
    assert "Retry" not in result.output + "".join(capfd.readouterr())
    assert not (layout.sae_dir("s") / "evals").exists()
