"""Example windows whose text never shows a replacement character: in a window holding
pieces of a split character (ids whose text alone is cut off), each run of such pieces is
re-read as a sequence, so the character reads whole on its first piece
(`saes.encoding.tokens.decoded_tokens`). Only those runs are decoded again."""

from __future__ import annotations

from typing import Any

import polars as pl

from sae_atlas.saes.encoding.tokens import decoded_tokens


def whole_characters(examples: pl.DataFrame, tokenizer: Any, split_ids: frozenset[int]) -> pl.DataFrame:
    """`examples` (columns token_ids, tokens) with every run of `split_ids` (pieces of a
    split character; a piece that cuts a character off decodes alone to a replacement
    character, so the pieces of one character are always one run) decoded as a sequence."""
    if not split_ids or examples.height == 0:
        return examples
    hit = examples["token_ids"].list.eval(pl.element().is_in(sorted(split_ids))).list.any().fill_null(False)
    rows = hit.arg_true().to_list()
    if not rows:
        return examples
    fixed = [_merge_runs(tokenizer, ids, texts, split_ids) for ids, texts in
             zip(examples["token_ids"].gather(rows).to_list(), examples["tokens"].gather(rows).to_list(), strict=True)]
    patch = pl.DataFrame({"_row": rows, "_tokens": fixed},
                         schema={"_row": pl.UInt32, "_tokens": examples.schema["tokens"]})
    return (examples.with_row_index("_row").join(patch, on="_row", how="left", maintain_order="left")
            .with_columns(pl.coalesce("_tokens", "tokens").alias("tokens")).drop("_row", "_tokens"))


def _merge_runs(tokenizer: Any, ids: list[int], texts: list[str], split_ids: frozenset[int]) -> list[str]:
    out, start = list(texts), None
    for i, token_id in enumerate([*ids, None]):
        if token_id in split_ids:
            start = i if start is None else start
        elif start is not None:
            out[start:i] = decoded_tokens(tokenizer, ids[start:i])
            start = None
    return out
