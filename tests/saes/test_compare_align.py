"""Aligning two tokenizations of the same text by character spans."""

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.align import align_spans, align_texts, token_spans
from sae_atlas.saes.models import TINY_WORDS, _tiny_tokenizer

TEXT = "The cat sat on the mat. Monday, or Tuesday!"


def split_tokenizer(pattern: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the pieces `pattern` isolates (every piece of TEXT known)."""
    core = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    pieces = {p for p, _ in core.pre_tokenizer.pre_tokenize_str(TEXT)}
    core = Tokenizer(models.WordLevel({"<unk>": 0, **{p: i + 1 for i, p in enumerate(sorted(pieces))}},
                                      unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")


def test_each_aligned_token_pair_reads_the_same_characters():
    words = _tiny_tokenizer(TINY_WORDS)  # lowercased words and punctuation, spaces dropped
    chars = split_tokenizer(".")  # one token per character, spaces included
    a, b = token_spans(words, TEXT), token_spans(chars, TEXT)
    pairs = align_spans(a, b)
    vocab_a = {i: w for w, i in words.get_vocab().items()}
    vocab_b = {i: w for w, i in chars.get_vocab().items()}
    # every word token of A is paired with the character token of B that ends it
    assert pairs.a.tolist() == list(range(len(a.ids)))
    for i, j, end in zip(pairs.a, pairs.b, pairs.ends, strict=True):
        assert vocab_a[int(a.ids[i])] == TEXT[a.starts[i]:end].lower()
        assert vocab_b[int(b.ids[j])] == TEXT[end - 1] and b.ends[j] == end
    monday = TEXT.index("Monday")
    k = pairs.ends.tolist().index(monday + len("Monday"))
    assert vocab_a[int(a.ids[pairs.a[k]])] == "monday" and b.starts[pairs.b[k]] == monday + 5


def test_tokens_ending_inside_the_other_sides_token_are_left_out():
    pieces = split_tokenizer(r"\w\w?|[^\w]")  # Mon|da|y, ca|t, ...
    words = _tiny_tokenizer(TINY_WORDS)
    a, b = token_spans(pieces, TEXT), token_spans(words, TEXT)
    pairs = align_spans(a, b)
    assert len(pairs.a) == len(b.ids)  # every word ends at the end of one of its pieces
    assert all(TEXT[a.starts[i]:a.ends[i]] == TEXT[e - (a.ends[i] - a.starts[i]):e] for i, e in zip(
        pairs.a, pairs.ends, strict=True))
    assert len(a.ids) > len(pairs.a)  # pieces ending inside a word ("Mo", "nd") have no partner


def test_texts_that_do_not_align_are_refused():
    words = _tiny_tokenizer(TINY_WORDS)
    with_space = split_tokenizer(r"\w+\s|[^\w\s]\s?|\w+")  # every token ends after its trailing space
    with pytest.raises(InvalidInputError, match="do not align"):
        align_texts(words, with_space, ["the cat sat "])
    slow = type("Slow", (), {"is_fast": False})()
    with pytest.raises(InvalidInputError, match="not a fast tokenizer"):
        token_spans(slow, TEXT, side="B")
