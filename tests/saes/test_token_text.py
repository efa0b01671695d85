"""Token texts never show a replacement character. Planted: a byte-level BPE tokenizer that
never saw CJK or accented text splits '你' (3 bytes) and 'é' (2 bytes) over byte pieces,
each of which decodes alone to '\ufffd'. In a sequence the character reads whole on its
first piece, a lone piece shows its bytes, and labels built from example windows whose
centre is the last piece of '你' name '你'."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from sae_atlas.saes.encoding.tokens import REPLACEMENT, decoded_tokens, piece_text
from sae_atlas.saes.labels import auto_labels
from sae_atlas.saes.summary.logits import split_piece_ids, vocab_strings
from sae_atlas.saes.summary.token_text import whole_characters

TEXT = "the你 cat sat on the café mat"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(["the cat sat on the mat"] * 5, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>")


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_split_character_reads_whole_on_its_first_piece(tokenizer: Any) -> None:
    ids = _ids(tokenizer, TEXT)
    lone = [tokenizer.decode([i]) for i in ids]
    assert sum(REPLACEMENT in t for t in lone) == 5  # the plant: 3 pieces of '你', 2 of 'é'
    texts = decoded_tokens(tokenizer, ids)
    assert "".join(texts) == TEXT and not any(REPLACEMENT in t for t in texts)
    first = lone.index(next(t for t in lone if REPLACEMENT in t))
    assert texts[first:first + 3] == ["你", "", ""]
    # a window cut inside the character: the pieces left show their bytes
    cut = decoded_tokens(tokenizer, ids[first + 1:first + 3])
    assert cut == [piece_text(tokenizer, ids[first + 1]), piece_text(tokenizer, ids[first + 2])]
    assert cut == ["\\xbd", "\\xa0"]


def test_the_vocabulary_shows_partial_pieces_as_bytes(tokenizer: Any) -> None:
    n = len(tokenizer)
    texts, split = vocab_strings(tokenizer, n), split_piece_ids(tokenizer, n)
    assert len(split) >= 64 and not any(REPLACEMENT in t for t in texts)
    assert all(REPLACEMENT in tokenizer.decode([i]) for i in split)
    assert texts[_ids(tokenizer, "你")[0]] == "\\xe4"


def _tables(tokenizer: Any, merged: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Latent 0's top examples: windows of TEXT whose centre is the last piece of '你'
    (tokens read from the vocabulary, as a summary writes them, then merged or not)."""
    ids = _ids(tokenizer, TEXT)
    centre = [tokenizer.decode([i]) for i in ids].index(REPLACEMENT) + 2
    lone = [tokenizer.decode([i]) for i in ids]  # tables written before this fix
    vocab = vocab_strings(tokenizer, len(tokenizer))
    rows = [{"latent": 0, "kind": "top", "act": 3.0 - k, "centre": centre - s, "token_ids": ids[s:],
             "tokens": [vocab[i] for i in ids[s:]] if merged else lone[s:]} for k, s in enumerate((0, 1))]
    examples = pl.DataFrame(rows, schema={"latent": pl.Int64, "kind": pl.String, "act": pl.Float64,
                                          "centre": pl.Int64, "token_ids": pl.List(pl.Int64),
                                          "tokens": pl.List(pl.String)})
    if merged:
        examples = whole_characters(examples, tokenizer, split_piece_ids(tokenizer, len(tokenizer)))
    promotes = [vocab[i] for i in _ids(tokenizer, "你 mat")] if merged else lone[:4]
    features = pl.DataFrame({"latent": [0], "n_active": [5], "top_logit_tokens": [promotes]})
    return features, examples


def test_labels_of_a_split_character_name_it(tokenizer: Any) -> None:
    features, examples = _tables(tokenizer, merged=True)
    assert examples["tokens"][0].to_list()[1:4] == ["你", "", ""]
    label = auto_labels(features, examples)["text"][0]
    assert label.startswith('fires on "你" (after "the")') and REPLACEMENT not in label
    old_features, old_examples = _tables(tokenizer, merged=False)  # tables with '\ufffd' in them
    assert any(REPLACEMENT in t for t in old_examples["tokens"][0])
    assert REPLACEMENT not in auto_labels(old_features, old_examples)["text"][0]


def test_only_the_runs_of_split_pieces_are_read_again(tokenizer: Any) -> None:
    split = split_piece_ids(tokenizer, len(tokenizer))
    plain, mixed = _ids(tokenizer, "the cat sat"), _ids(tokenizer, TEXT)
    examples = pl.DataFrame({"latent": [7, 8], "token_ids": [plain, mixed],
                             "tokens": [["x"] * len(plain), [vocab_strings(tokenizer, len(tokenizer))[i] for i in mixed]]})
    merged = whole_characters(examples, tokenizer, split)
    assert merged.columns == examples.columns and merged["latent"].to_list() == [7, 8]
    assert merged["tokens"][0].to_list() == ["x"] * len(plain)  # no split piece: left as it was
    assert merged["tokens"][1].to_list() == decoded_tokens(tokenizer, mixed)
    assert whole_characters(examples.head(1), tokenizer, split).equals(examples.head(1))


def test_steering_targets_show_partial_pieces_as_bytes(tokenizer: Any) -> None:
    from sae_atlas.errors import InvalidInputError
    from sae_atlas.saes.intervene.steering_search import resolve_target

    pieces = _ids(tokenizer, "你")
    target = resolve_target(tokenizer, pieces[:2], len(tokenizer))
    assert target.tokens == ["\\xe4", "\\xbd"] and REPLACEMENT not in target.description
    with pytest.raises(InvalidInputError, match="encodes as 3 tokens") as refused:
        resolve_target(tokenizer, "你", len(tokenizer))
    assert REPLACEMENT not in str(refused.value) and "\\\\xe4" in str(refused.value)
