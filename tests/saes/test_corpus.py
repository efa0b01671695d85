"""Text sources and block packing."""

import json

import polars as pl
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.builtin_text import builtin_documents
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks, iter_documents
from sae_atlas.saes.models import tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_model(n_layers=1).tokenizer


def all_blocks(tokenizer, spec, **kw):
    batches = list(iter_blocks(tokenizer, spec, **kw))
    return torch.cat([b.token_ids for b in batches]), torch.cat([b.doc_ids for b in batches])


def test_builtin_corpus_is_real_text_with_concepts():
    docs = []
    for _, text in builtin_documents(seed=0):
        docs.append(text)
        if len(docs) == 300:
            break
    joined = " ".join(docs)
    assert "Return" in joined  # standard-library docstrings
    assert any(day in joined for day in ("Monday", "Friday", "Sunday"))
    assert any(month in joined for month in ("January", "March", "October"))


def test_blocks_have_bos_length_and_are_seeded(tokenizer):
    spec = CorpusSpec(context_size=16, seed=3)
    toks, docs = all_blocks(tokenizer, spec, max_blocks=20, batch_blocks=6)
    assert toks.shape == (20, 16) and docs.shape == (20, 16)
    assert (toks[:, 0] == tokenizer.bos_token_id).all()
    assert not (toks[:, 1:] == tokenizer.bos_token_id).any()
    again, _ = all_blocks(tokenizer, spec, max_blocks=20)
    other, _ = all_blocks(tokenizer, CorpusSpec(context_size=16, seed=4), max_blocks=20)
    assert torch.equal(toks, again) and not torch.equal(toks, other)
    no_bos, _ = all_blocks(tokenizer, CorpusSpec(context_size=16, prepend_bos=False), max_blocks=3)
    assert not (no_bos == tokenizer.bos_token_id).any()


def test_local_files_keep_document_ids(tmp_path, tokenizer):
    texts = ["the cat sat on the mat " * 5, "the dog ran " * 9, "a red car " * 7]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"body": t}) for t in texts))
    spec = CorpusSpec(source=str(tmp_path / "a.jsonl"), text_field="body", context_size=8)
    toks, docs = all_blocks(tokenizer, spec)
    eos = tokenizer.eos_token_id
    for doc_id, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        got = toks[docs == doc_id]
        got = got[got != tokenizer.bos_token_id]
        assert got.tolist() == ids[: len(got)]  # the tail of the last doc may be cut
    pl.DataFrame({"text": texts}).write_parquet(tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text(texts[0])
    for name in ("b.parquet", "c.txt"):
        assert len(all_blocks(tokenizer, CorpusSpec(source=str(tmp_path / name), context_size=8))[0]) > 0


def test_bad_sources_give_clear_errors(tmp_path, tokenizer):
    (tmp_path / "empty.txt").write_text("   \n")
    with pytest.raises(InvalidInputError, match="empty or too short"):
        all_blocks(tokenizer, CorpusSpec(source=str(tmp_path / "empty.txt")))
    with pytest.raises(InvalidInputError, match="not found"):
        list(iter_documents(CorpusSpec(source=str(tmp_path / "nope.txt"))))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(InvalidInputError, match="unsupported corpus file"):
        list(iter_documents(CorpusSpec(source=str(tmp_path / "x.csv"))))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"other": 1}\n')
    with pytest.raises(InvalidInputError, match="bad.jsonl:2: no text field 'text'"):
        list(iter_documents(CorpusSpec(source=str(tmp_path / "bad.jsonl"))))
    (tmp_path / "d").mkdir()
    with pytest.raises(InvalidInputError, match="contains no"):
        list(iter_documents(CorpusSpec(source=str(tmp_path / "d"))))
    with pytest.raises(InvalidInputError, match="context_size"):
        CorpusSpec(context_size=1)
