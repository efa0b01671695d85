"""SAEBench's sparse-probing datasets, fetched from the Hugging Face hub by their SAEBench name.

SAEBench (Karvonen et al. 2025, `sae_bench_utils/dataset_info.py` and `dataset_utils.py`)
probes eight labelled sets, each with five (or fewer) chosen classes:

- `LabHC/bias_in_bios_class_set1/2/3`: biographies (`hard_text`) labelled by profession id,
  sampled balanced by gender within each profession;
- `canrager/amazon_reviews_mcauley_1and5`: reviews labelled by product category id,
  balanced by rating; `..._sentiment`: the same reviews labelled by rating (1.0 vs 5.0);
- `fancyzhx/ag_news`: news labelled by topic id;
- `Helsinki-NLP/europarl`: one side of a translation pair, labelled by its language;
- `codeparrot/github-code`: code labelled by language, its first 150 characters (about 50
  tokens of licence header) skipped and only files longer than 534 characters kept.

Labels are the class ids as SAEBench writes them ("0", "21", "1.0", "Python"), so a result's
`dataset_name` and classes read as SAEBench's. Rows are streamed (seeded shuffle buffer)
until every class holds `per_class` texts. The hub is asked once first, without retries
(`check_hub`): offline, or when the hub refuses, the set is refused by name at once with
what to use instead.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sae_atlas.errors import InvalidInputError

RowLoader = Callable[[str, str | None], Iterable[dict[str, Any]]]  # (dataset, config) -> rows
MAX_ROWS_SCANNED = 400_000
SHUFFLE_BUFFER = 10_000
HUB_TIMEOUT_S = 10.0  # the one request that checks the hub before streaming
_CODE_SKIP_CHARS = 150  # SAEBench: 50 tokens x 3 characters of licence header
_CODE_MIN_CHARS = 534  # SAEBench: 128 tokens x 3 characters + the skipped part
_EUROPARL_PAIRS = {"en": "en-fr", "fr": "fr-it", "de": "de-en", "es": "es-fr", "nl": "nl-pt"}


@dataclass(frozen=True)
class HubRecipe:
    """Where a SAEBench set's texts and labels come from: the hub dataset and its configs,
    the text and label of a row (None: skip the row), the chosen classes and the column
    the classes are balanced by (None: not balanced)."""

    dataset: str
    configs: tuple[str | None, ...]
    text: Callable[[dict[str, Any], str | None], str | None]
    label: Callable[[dict[str, Any], str | None], str | None]
    classes: tuple[str, ...]
    balance_by: str | None = None


def _column(name: str) -> Callable[[dict[str, Any], str | None], str | None]:
    def read(row: dict[str, Any], config: str | None) -> str | None:
        value = row.get(name)
        return None if value is None else str(value)
    return read


def _europarl_language(row: dict[str, Any], config: str | None) -> str | None:
    language = next((lang for lang, pair in _EUROPARL_PAIRS.items() if pair == config), None)
    return language if language and language in row.get("translation", {}) else None


def _europarl_text(row: dict[str, Any], config: str | None) -> str | None:
    language = _europarl_language(row, config)
    return row["translation"][language] if language else None


def _code_text(row: dict[str, Any], config: str | None) -> str | None:
    code = row.get("code")
    return code[_CODE_SKIP_CHARS:] if isinstance(code, str) and len(code) > _CODE_MIN_CHARS else None


def _bias_in_bios(classes: tuple[str, ...]) -> HubRecipe:
    return HubRecipe("LabHC/bias_in_bios", (None,), _column("hard_text"), _column("profession"), classes, "gender")


SAEBENCH_HUB_SETS: dict[str, HubRecipe] = {
    "LabHC/bias_in_bios_class_set1": _bias_in_bios(("0", "1", "2", "6", "9")),
    "LabHC/bias_in_bios_class_set2": _bias_in_bios(("11", "13", "14", "18", "19")),
    "LabHC/bias_in_bios_class_set3": _bias_in_bios(("20", "21", "22", "25", "26")),
    "canrager/amazon_reviews_mcauley_1and5": HubRecipe(
        "canrager/amazon_reviews_mcauley_1and5", (None,), _column("text"), _column("category"),
        ("1", "2", "3", "5", "6"), "rating"),
    "canrager/amazon_reviews_mcauley_1and5_sentiment": HubRecipe(
        "canrager/amazon_reviews_mcauley_1and5", (None,), _column("text"), _column("rating"), ("1.0", "5.0")),
    "codeparrot/github-code": HubRecipe(
        "codeparrot/github-code", (None,), _code_text, _column("language"), ("C", "Python", "HTML", "Java", "PHP")),
    "fancyzhx/ag_news": HubRecipe("fancyzhx/ag_news", (None,), _column("text"), _column("label"), ("0", "1", "2", "3")),
    "Helsinki-NLP/europarl": HubRecipe("Helsinki-NLP/europarl", tuple(_EUROPARL_PAIRS.values()), _europarl_text,
                                       _europarl_language, tuple(_EUROPARL_PAIRS)),
}


def hub_rows(seed: int) -> RowLoader:
    """Rows of a hub dataset's train split, streamed through a seeded shuffle buffer."""
    def load(dataset: str, config: str | None) -> Iterable[dict[str, Any]]:
        from datasets import load_dataset

        stream = load_dataset(dataset, config, split="train", streaming=True)
        return stream.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)
    return load


def _wanted(recipe: HubRecipe, per_class: int) -> Callable[[str, dict[str, Any]], bool]:
    """Whether one more text of a class (and balance value) is still needed."""
    per_group = max(1, per_class // 2)
    counts: dict[tuple[str, str], int] = defaultdict(int)

    def take(label: str, row: dict[str, Any]) -> bool:
        key = (label, str(row.get(recipe.balance_by)) if recipe.balance_by else "")
        if counts[key] >= (per_group if recipe.balance_by else per_class):
            return False
        counts[key] += 1
        return True
    return take


def hub_probe_set(name: str, per_class: int, seed: int, *, rows: RowLoader | None = None) -> tuple[list[str], list[str]]:
    """`(texts, labels)` of SAEBench set `name`: up to `per_class` texts of each chosen class
    (split evenly over the balance column's values where SAEBench balances). InvalidInputError
    for an unknown name, a dataset the hub does not give, or a class with fewer than two texts.
    Read from the hub once per process (every SAE of a suite probes the same texts)."""
    if rows is None:
        texts, labels = _from_hub(name, per_class, seed)
        return list(texts), list(labels)
    return _collect(name, per_class, rows)


@functools.cache
def _from_hub(name: str, per_class: int, seed: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    check_hub(name)
    texts, labels = _collect(name, per_class, hub_rows(seed))
    return tuple(texts), tuple(labels)


def _recipe(name: str) -> HubRecipe:
    recipe = SAEBENCH_HUB_SETS.get(name)
    if recipe is None:
        raise InvalidInputError(f"unknown SAEBench probe set {name!r}; valid: {', '.join(SAEBENCH_HUB_SETS)}")
    return recipe


def _unavailable(name: str, recipe: HubRecipe, exc: Exception) -> InvalidInputError:
    return InvalidInputError(
        f"SAEBench probe set {name!r} reads the Hugging Face dataset {recipe.dataset!r}, which could not be "
        f"loaded ({type(exc).__name__}: {str(exc)[:200]}); offline, probe the built-in sets or a .jsonl "
        "file (--probe-data)")


def check_hub(name: str) -> None:
    """Ask the hub once, without retries, whether set `name`'s dataset can be read, so that
    offline (or with `HF_HUB_OFFLINE` set) the set is refused at once instead of after the
    dataset client's retries with backoff; InvalidInputError naming the set otherwise."""
    from huggingface_hub import HfApi

    recipe = _recipe(name)
    try:
        HfApi().dataset_info(recipe.dataset, timeout=HUB_TIMEOUT_S)
    except Exception as exc:  # offline mode, no route, not found, gated: one answer, no retry
        raise _unavailable(name, recipe, exc) from exc


def _collect(name: str, per_class: int, load: RowLoader) -> tuple[list[str], list[str]]:
    recipe = _recipe(name)
    take = _wanted(recipe, per_class)
    texts_by_class: dict[str, list[str]] = defaultdict(list)
    full = per_class * len(recipe.classes)
    try:
        for config in recipe.configs:
            for scanned, row in enumerate(load(recipe.dataset, config)):
                label = recipe.label(row, config)
                if label in recipe.classes:
                    text = recipe.text(row, config)
                    if text and text.strip() and take(label, row):
                        texts_by_class[label].append(text)
                if scanned >= MAX_ROWS_SCANNED or sum(map(len, texts_by_class.values())) >= full:
                    break
    except Exception as exc:  # the hub's client raises many kinds: offline, not found, gated, network
        raise _unavailable(name, recipe, exc) from exc
    short = {cls: len(texts_by_class[cls]) for cls in recipe.classes if len(texts_by_class[cls]) < 2}
    if short:
        raise InvalidInputError(f"SAEBench probe set {name!r}: classes {short} have fewer than two texts in "
                                f"{recipe.dataset!r}")
    texts = [text for cls in recipe.classes for text in texts_by_class[cls]]
    labels = [cls for cls in recipe.classes for _ in texts_by_class[cls]]
    return texts, labels
