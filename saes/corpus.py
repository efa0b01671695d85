"""Text sources turned into fixed-length token blocks, with document ids kept.

A source is `"builtin"` (see `saes.builtin_text`), a local `.txt` / `.jsonl` /
`.parquet` file or a folder of them, or `"hf:<dataset>[:<split>]"` for a Hugging Face
dataset (needs the `datasets` package and a network connection).

Documents are tokenized without special tokens and packed back to back, separated by
the EOS token when the tokenizer has one; each block starts with BOS when
`prepend_bos` is set. Block order is fixed by the seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.builtin_text import builtin_documents

LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")


@dataclass
class CorpusSpec:
    """Where text comes from and how it is cut into blocks (recorded in manifests)."""

    source: str = "builtin"
    text_field: str = "text"
    context_size: int = 128
    prepend_bos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.context_size < 2:
            raise InvalidInputError(f"context_size must be at least 2, got {self.context_size}")


def jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """`(line number, value)` of every non-blank line of a `.jsonl` file; InvalidInputError
    naming the file and line of one that is not JSON."""
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc


def _read_local(path: Path, text_field: str) -> Iterator[str]:
    if path.suffix == ".txt":
        yield path.read_text(encoding="utf-8", errors="replace")
    elif path.suffix == ".jsonl":
        for line_no, record in jsonl_records(path):
            if not isinstance(record, dict) or text_field not in record:
                raise InvalidInputError(f"{path}:{line_no}: no text field {text_field!r}")
            yield str(record[text_field])
    else:
        import polars as pl

        try:
            frame = pl.read_parquet(path, columns=[text_field])
        except Exception as exc:  # polars raises several types for a bad file or column
            raise InvalidInputError(f"{path}: cannot read text field {text_field!r} ({exc})") from exc
        yield from (str(t) for t in frame[text_field] if t is not None)


def _local_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in LOCAL_SUFFIXES)
        if not files:
            raise InvalidInputError(f"{path} contains no {', '.join(LOCAL_SUFFIXES)} files")
        return files
    if path.suffix not in LOCAL_SUFFIXES:
        raise InvalidInputError(f"{path}: unsupported corpus file; use {', '.join(LOCAL_SUFFIXES)}")
    return [path]


def _hf_documents(name: str, text_field: str, seed: int) -> Iterator[tuple[int, str]]:
    try:
        import datasets
    except ImportError as exc:
        raise InvalidInputError("Hugging Face datasets need `pip install datasets`") from exc
    dataset_name, _, split = name.partition(":")
    stream = datasets.load_dataset(dataset_name, split=split or "train", streaming=True)
    for doc_id, record in enumerate(stream.shuffle(seed=seed, buffer_size=10_000)):
        if text_field not in record:
            raise InvalidInputError(f"dataset {dataset_name} has no text field {text_field!r}")
        yield doc_id, str(record[text_field])


def iter_documents(spec: CorpusSpec) -> Iterator[tuple[int, str]]:
    """(doc id, text) pairs of a source in the seeded order."""
    if spec.source == "builtin":
        yield from builtin_documents(spec.seed)
        return
    if spec.source.startswith("hf:"):
        yield from _hf_documents(spec.source[3:], spec.text_field, spec.seed)
        return
    path = Path(spec.source).expanduser()
    if not path.exists():
        raise InvalidInputError(
            f"corpus source {spec.source!r} not found; use 'builtin', a local "
            f"{'/'.join(LOCAL_SUFFIXES)} file or folder, or 'hf:<dataset>'"
        )
    docs = [text for file in _local_files(path) for text in _read_local(file, spec.text_field)]
    order = list(range(len(docs)))
    random.Random(spec.seed).shuffle(order)
    for doc_id in order:
        yield doc_id, docs[doc_id]


@dataclass
class TokenBlocks:
    """A batch of packed blocks."""

    token_ids: torch.Tensor  # [n, T] int64
    doc_ids: torch.Tensor  # [n, T] int64


def iter_blocks(
    tokenizer: Any, spec: CorpusSpec, *, max_blocks: int | None = None, batch_blocks: int = 8
) -> Iterator[TokenBlocks]:
    """Pack a source into blocks of `spec.context_size` tokens, yielded `batch_blocks` at a time.

    Raises InvalidInputError when the source yields no text or not enough for one block.
    """
    bos = tokenizer.bos_token_id
    if spec.prepend_bos and bos is None:
        raise InvalidInputError("prepend_bos needs a tokenizer with a BOS token")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id not in (None, bos) else None
    body = spec.context_size - (1 if spec.prepend_bos else 0)
    tokens: list[int] = []
    docs: list[int] = []
    batch_toks: list[list[int]] = []
    batch_docs: list[list[int]] = []
    made = 0
    for doc_id, text in iter_documents(spec):
        if not text.strip():
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if eos is not None:
            ids = [*ids, eos]
        tokens.extend(ids)
        docs.extend([doc_id] * len(ids))
        while len(tokens) >= body:
            head = [bos] if spec.prepend_bos else []
            batch_toks.append(head + tokens[:body])
            batch_docs.append(docs[:1] * len(head) + docs[:body])
            del tokens[:body], docs[:body]
            made += 1
            if len(batch_toks) == batch_blocks or made == max_blocks:
                yield TokenBlocks(torch.tensor(batch_toks), torch.tensor(batch_docs))
                batch_toks, batch_docs = [], []
            if made == max_blocks:
                return
    if batch_toks:
        yield TokenBlocks(torch.tensor(batch_toks), torch.tensor(batch_docs))
    if made == 0:
        raise InvalidInputError(
            f"corpus {spec.source!r} yielded fewer than {spec.context_size} tokens: "
            "it is empty or too short for one block"
        )
