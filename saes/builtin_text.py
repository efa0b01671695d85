"""The built-in corpus: real English that is always present offline.

Two kinds of documents, interleaved in a seeded order:

- docstrings of Python's standard library, read with `ast` from the interpreter's own
  source files (nothing is imported or executed);
- concept sentences generated from templates: weekdays, months, numbers and simple
  category words (animals, fruit, colours, countries, ...), which the geometry analyses
  look for.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Iterator
from functools import cache
from pathlib import Path

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]
NUMBER_WORDS = [
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
    "eighteen", "nineteen", "twenty",
]
CATEGORIES = {
    "animal": ["dog", "cat", "horse", "cow", "sheep", "lion", "tiger", "bear", "rabbit", "mouse"],
    "bird": ["eagle", "owl", "sparrow", "crow", "duck", "goose", "parrot", "robin"],
    "fish": ["salmon", "trout", "shark", "tuna", "cod", "carp"],
    "fruit": ["apple", "banana", "orange", "pear", "grape", "lemon", "cherry", "peach"],
    "vegetable": ["carrot", "potato", "onion", "cabbage", "pepper", "bean", "pea"],
    "colour": ["red", "blue", "green", "yellow", "black", "white", "purple", "brown"],
    "country": ["France", "Germany", "Spain", "Italy", "China", "Japan", "India", "Brazil"],
    "tool": ["hammer", "saw", "drill", "wrench", "knife", "shovel"],
    "furniture": ["chair", "table", "bed", "sofa", "desk", "shelf"],
    "vehicle": ["car", "bus", "truck", "train", "bicycle", "boat", "plane"],
}

_TEMPLATES = [
    lambda r: f"Today is {r.choice(WEEKDAYS)}, and tomorrow is {r.choice(WEEKDAYS)}.",
    lambda r: (lambda i: f"After {WEEKDAYS[i]} comes {WEEKDAYS[(i + 1) % 7]}.")(r.randrange(7)),
    lambda r: f"The meeting was moved to {r.choice(WEEKDAYS)} morning.",
    lambda r: f"My birthday is in {r.choice(MONTHS)}.",
    lambda r: (lambda i: f"The month after {MONTHS[i]} is {MONTHS[(i + 1) % 12]}.")(r.randrange(12)),
    lambda r: f"The project started in {r.choice(MONTHS)} {r.randrange(1950, 2030)}.",
    lambda r: f"There are {r.choice(NUMBER_WORDS)} books on the shelf.",
    lambda r: (lambda i: f"{NUMBER_WORDS[i].capitalize()} plus one is {NUMBER_WORDS[i + 1]}.")(r.randrange(19)),
    lambda r: f"She counted {r.randrange(2, 500)} people at the station.",
    lambda r: (lambda c: f"A {r.choice(CATEGORIES[c])} is a kind of {c}.")(r.choice(list(CATEGORIES))),
    lambda r: f"We saw a {r.choice(CATEGORIES['animal'])} and a {r.choice(CATEGORIES['bird'])} in the park.",
    lambda r: f"He ate an {r.choice(['apple', 'orange'])} and some {r.choice(CATEGORIES['vegetable'])}s.",
    lambda r: f"The {r.choice(CATEGORIES['furniture'])} is {r.choice(CATEGORIES['colour'])}.",
    lambda r: f"They travelled from {r.choice(CATEGORIES['country'])} to {r.choice(CATEGORIES['country'])} by {r.choice(CATEGORIES['vehicle'])}.",
    lambda r: f"Hand me the {r.choice(CATEGORIES['tool'])}, please.",
]

_SKIP_TOP = {"site-packages", "test", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}
_MIN_DOCSTRING = 40


@cache
def stdlib_source_files() -> tuple[Path, ...]:
    """The standard library's own .py files (tests and bundled tools skipped), sorted;
    listed once per process (a walk of the whole library)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in _SKIP_TOP or "tests" in parts or parts[0].startswith("__phello"):
            continue
        files.append(path)
    return tuple(files)


def docstrings_of(path: Path) -> list[str]:
    """Docstrings (modules, classes, functions) of one source file; [] if it does not parse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= _MIN_DOCSTRING:
                docs.append(doc)
    return docs


def concept_document(rng: random.Random, n_sentences: int = 12) -> str:
    """A paragraph of template sentences about weekdays, months, numbers and categories."""
    return " ".join(rng.choice(_TEMPLATES)(rng) for _ in range(n_sentences))


def builtin_documents(seed: int = 0) -> Iterator[tuple[int, str]]:
    """(doc id, text) of the built-in corpus, lazily, in an order fixed by `seed`.

    Source files are visited in a seeded order; after each file comes one generated
    concept paragraph, so any prefix of the stream contains both kinds. Doc ids are
    stable: `file_rank * 1000 + k` for docstrings, `file_rank * 1000 + 999` for concepts.
    """
    files = stdlib_source_files()
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    for rank in order:
        for k, doc in enumerate(docstrings_of(files[rank])[:998]):
            yield rank * 1000 + k, doc
        yield rank * 1000 + 999, concept_document(random.Random(seed * 1_000_003 + rank))
