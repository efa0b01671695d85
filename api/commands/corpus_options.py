"""The corpus options shared by the commands that run a model over text (`cache`, and
`summarize` / `eval` with `--from-model`); `when` prefixes their help, e.g. "With --from-model"."""

from __future__ import annotations

from typing import Any

import typer

FROM_MODEL = "With --from-model"
"""The `when` of the options of `summarize` and `eval`, which read a corpus only with --from-model."""


def _help(when: str, text: str) -> str:
    return f"{when}: {text[0].lower()}{text[1:]}" if when else text


def corpus_option(when: str = "") -> Any:
    """`--corpus`: builtin, a file or folder of texts, or a Hugging Face dataset."""
    return typer.Option("builtin", help=_help(when, "builtin, a .txt/.jsonl/.parquet file or folder, or hf:<dataset>."))


def text_field_option(when: str = "") -> Any:
    """`--text-field`: the text field of .jsonl / .parquet / HF records."""
    return typer.Option("text", help=_help(when, "Text field of .jsonl / .parquet / HF records."))


def context_option(when: str = "") -> Any:
    """`--context`: block length in tokens."""
    return typer.Option(128, min=2, help=_help(when, "Block length in tokens."))


def no_bos_option(when: str = "") -> Any:
    """`--no-bos`: blocks do not start with BOS."""
    return typer.Option(False, "--no-bos", help=_help(when, "Do not start blocks with BOS."))


def batch_blocks_option(when: str = "", *, bounded: bool = True) -> Any:
    """`--batch-blocks`: blocks per forward pass (at least 1: checked here when `bounded`, else
    by the operation's parameters the value goes to)."""
    return typer.Option(8, min=1 if bounded else None, help=_help(when, "Blocks per forward pass."))
