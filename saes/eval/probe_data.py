"""Labelled text sets for sparse probing.

Built in (offline): `topics`, template sentences naming a word of one topic family of the
built-in corpus (`saes.builtin_text`: weekdays, months, numbers and its category words),
labelled by the family; `code_vs_prose`, function bodies from Python's standard library
(docstrings removed, `ast.unparse`) against its docstrings. A user set is a `.jsonl`
file with a text field and a label field; it is refused by name without labels or with
fewer than two classes. SAEBench's own sets are read from the hub by their SAEBench name
when it is reachable (`saes.eval.hub_probe_sets`).
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.builtin_text import (
    CATEGORIES,
    MONTHS,
    NUMBER_WORDS,
    WEEKDAYS,
    docstrings_of,
    stdlib_source_files,
)
from sae_atlas.saes.corpus import jsonl_records

BuiltinProbeSet = Literal["topics", "code_vs_prose"]
BUILTIN_PROBE_SETS: tuple[BuiltinProbeSet, ...] = get_args(BuiltinProbeSet)
MAX_CHARS = 400
_TOPIC_TEMPLATES = (
    "I keep thinking about {w}.",
    "She wrote {w} on the board.",
    "Everyone talked about {w} yesterday.",
    "The answer, in the end, was {w}.",
    "Tell me more about {w}, please.",
)


@dataclass(frozen=True)
class ProbeSet:
    """Texts and one label per text."""

    name: str
    texts: list[str]
    labels: list[str]

    @property
    def classes(self) -> list[str]:
        return sorted(set(self.labels))


def topic_families() -> dict[str, list[str]]:
    """Topic family -> its words, from the built-in corpus' vocabularies."""
    return {"weekday": WEEKDAYS, "month": MONTHS, "number": NUMBER_WORDS, **CATEGORIES}


def topics_set(per_class: int, seed: int) -> ProbeSet:
    """Up to `per_class` template sentences per topic family (seeded sample)."""
    rng = random.Random(seed)
    texts, labels = [], []
    for family, words in topic_families().items():
        sentences = [t.format(w=w) for w in words for t in _TOPIC_TEMPLATES]
        rng.shuffle(sentences)
        texts += sentences[:per_class]
        labels += [family] * len(sentences[:per_class])
    return ProbeSet("topics", texts, labels)


def _function_bodies(path: Path) -> list[str]:
    """Source of the functions of one file without their docstrings; [] if it does not parse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    bodies = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and len(node.body) > 1:
            if ast.get_docstring(node) is not None:
                node.body = node.body[1:]
            bodies.append(ast.unparse(node)[:MAX_CHARS])
    return bodies


def code_vs_prose_set(per_class: int, seed: int) -> ProbeSet:
    """`per_class` standard-library function bodies ("code") and docstrings ("prose")."""
    files = list(stdlib_source_files())
    random.Random(seed).shuffle(files)
    code: list[str] = []
    prose: list[str] = []
    for path in files:
        if len(code) >= per_class and len(prose) >= per_class:
            break
        code += _function_bodies(path)[:2]
        prose += [doc[:MAX_CHARS] for doc in docstrings_of(path)[:2]]
    code, prose = code[:per_class], prose[:per_class]
    return ProbeSet("code_vs_prose", code + prose, ["code"] * len(code) + ["prose"] * len(prose))


def probe_set_names() -> tuple[str, ...]:
    """Every set name `named_probe_set` takes: the built-in ones, then SAEBench's hub sets."""
    from sae_atlas.saes.eval.hub_probe_sets import SAEBENCH_HUB_SETS

    return (*BUILTIN_PROBE_SETS, *SAEBENCH_HUB_SETS)


def named_probe_set(name: str, per_class: int, seed: int) -> ProbeSet:
    """A built-in set, or one of SAEBench's hub sets by its SAEBench name
    (`saes.eval.hub_probe_sets`; InvalidInputError listing the valid names)."""
    from sae_atlas.saes.eval.hub_probe_sets import SAEBENCH_HUB_SETS, hub_probe_set

    if name == "topics":
        return topics_set(per_class, seed)
    if name == "code_vs_prose":
        return code_vs_prose_set(per_class, seed)
    if name in SAEBENCH_HUB_SETS:
        return ProbeSet(name, *hub_probe_set(name, per_class, seed))
    raise unknown_probe_set(name)


def unknown_probe_set(name: str) -> InvalidInputError:
    """The error for a set name that is neither built in nor SAEBench's."""
    return InvalidInputError(f"unknown probe set {name!r}; valid: {', '.join(probe_set_names())} "
                             f"(the first {len(BUILTIN_PROBE_SETS)} built in, the others SAEBench's from the hub)")


def file_probe_set(path: str | Path, label_field: str, text_field: str = "text") -> ProbeSet:
    """A user `.jsonl` set: one JSON object per line with `text_field` and `label_field`.
    InvalidInputError naming the file and line when a line lacks either field, and the
    file when it has fewer than two classes."""
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"probe data file {file} does not exist")
    texts, labels = [], []
    for number, row in jsonl_records(file):
        if not isinstance(row, dict) or label_field not in row or row[label_field] is None:
            fields = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
            raise InvalidInputError(f"{file} line {number} has no label field {label_field!r} "
                                    f"(fields: {fields}); name it with --label-field")
        if not isinstance(row.get(text_field), str) or not row[text_field].strip():
            raise InvalidInputError(f"{file} line {number} has no text in field {text_field!r}")
        texts.append(row[text_field][:MAX_CHARS])
        labels.append(str(row[label_field]))
    probe_set = ProbeSet(file.stem, texts, labels)
    if len(probe_set.classes) < 2:
        found = ", ".join(repr(c) for c in probe_set.classes) or "none"
        raise InvalidInputError(f"{file} has fewer than two classes in label field {label_field!r} "
                                f"(found: {found}); a probe needs at least two")
    return probe_set
