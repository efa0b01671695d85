"""Example windows whose text never shows a replacement character: the tokens of a window
holding a piece of a split character are re-read from its ids as a sequence, so the
character reads whole on its first piece (`saes.encoding.tokens.decoded_tokens`)."""

from __future__ import annotations

from typing import Any

import polars as pl

from saes.encoding.tokens import decoded_tokens


def whole_characters(examples: pl.DataFrame, tokenizer: Any, split_ids: frozenset[int]) -> pl.DataFrame:
    """`examples` (columns token_ids, tokens) with the `tokens` of every window that holds
    one of `split_ids` (pieces of a split character) decoded as a sequence."""
    if not split_ids or examples.height == 0:
        return examples
    hit = examples["token_ids"].list.eval(pl.element().is_in(sorted(split_ids))).list.any().fill_null(False)
    rows = hit.arg_true().to_list()
    if not rows:
        return examples
    tokens = examples["tokens"].to_list()
    for row, ids in zip(rows, examples["token_ids"].gather(rows).to_list(), strict=True):
        tokens[row] = decoded_tokens(tokenizer, ids)
    return examples.with_columns(pl.Series("tokens", tokens, dtype=examples.schema["tokens"]))
