"""Prompt sets a steering search ranks on and confirms on, in several styles.

A style is where a user might steer:

- `neutral`: the first tokens of built-in corpus documents (`output_scores.neutral_prompts`),
  a seeded draw kept apart from the steering tables' draws;
- `in_context`: sentences cut right before a word of the target's class, so the class is a
  plausible next word ("The shop is closed every" for a day), from templates per category;
- `question`: a question about the class and the start of its answer ("Q: Which day suits
  you best? A: Let's meet on"), from templates per category;
- `user`: the user's own prompts (a file, one per line or a JSON list, or a list over HTTP).

A category (`days`, `months`, `numbers`, `colours`, `animals`, or one of the user's own:
`{"name", "values", "templates", "questions"}`) is a class of words whose first token after
a space is a target; a token target's category is the one listing it, and the category's
other tokens are its siblings (the other days for " Sunday"): a token target prefers
features that raise it over them.

`split_sets` makes the two disjoint sets of a search: the ranking (screen) set and the
confirmation set. Neutral prompts come from two different seeds; a category's templates
alternate between the two sets (even ones rank, odd ones confirm), as do the user's prompts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.builtin_text import CATEGORIES, MONTHS, NUMBER_WORDS, WEEKDAYS

if TYPE_CHECKING:  # imported where used: the CLI's options read this module's names without torch
    import torch

    from sae_atlas.saes.models import ModelHandle

PromptStyle = Literal["neutral", "in_context", "question", "user"]
PROMPT_STYLES: tuple[PromptStyle, ...] = get_args(PromptStyle)
MAX_USER_PROMPTS = 256
MAX_PROMPT_CHARS = 1000
MIN_CONFIRM_PROMPTS = 2


@dataclass(frozen=True)
class Category:
    """A class of words and prompts that end where one of them is a plausible next word."""

    name: str
    values: tuple[str, ...]
    templates: tuple[str, ...]  # in_context
    questions: tuple[str, ...]  # question


BUILTIN_CATEGORIES: dict[str, Category] = {c.name: c for c in [
    Category("days", tuple(WEEKDAYS), (
        "The shop is closed every", "The meeting has been moved to", "We always go swimming on",
        "The report is due next", "My favourite day of the week is", "The parcel should arrive by",
        "The museum is free to visit on", "They got married last"),
        ("Q: Which day of the week suits you best for the call?\nA: Let's do it on",
         "Q: When does the market open?\nA: It opens every", "Q: What day is the concert?\nA: The concert is on",
         "Q: When did you arrive?\nA: I arrived last")),
    Category("months", tuple(MONTHS), (
        "The festival takes place every year in", "Her birthday is in", "The school year starts in",
        "The coldest month here is", "The contract ends in", "We are planning a trip for next",
        "The first snow usually falls in", "The book was published last"),
        ("Q: When is your birthday?\nA: It is in", "Q: Which month is the warmest?\nA: Usually it is",
         "Q: When does the course start?\nA: It starts in", "Q: When did the shop open?\nA: It opened last")),
    Category("numbers", tuple(NUMBER_WORDS[:12]), (
        "The recipe needs exactly", "She has", "The room holds no more than", "He waited for",
        "There were only", "We bought", "The team scored", "It took them"),
        ("Q: How many cats do you have?\nA: I have", "Q: How many people came?\nA: About",
         "Q: How many chairs are left?\nA: There are", "Q: How many books did you read?\nA: I read")),
    Category("colours", tuple(CATEGORIES["colour"]), (
        "She painted the door", "His favourite colour is", "The sky turned", "The flag is red and",
        "The walls of the kitchen are", "He wore a shirt that was bright", "The leaves turn", "The car is dark"),
        ("Q: What colour is the house?\nA: It is", "Q: Which colour do you like?\nA: I like",
         "Q: What colour was the dress?\nA: It was", "Q: What colour should we paint it?\nA: Let's paint it")),
    Category("animals", tuple(CATEGORIES["animal"]), (
        "In the field we saw a", "The farmer fed the", "At the zoo the children watched the",
        "She takes her pet", "The barking came from a", "Out of the forest came a", "He is afraid of the",
        "The picture shows a sleeping"),
        ("Q: Which animal did you see?\nA: I saw a", "Q: What pet do you have?\nA: I have a",
         "Q: What was in the barn?\nA: There was a", "Q: Which animal is the strongest?\nA: I think the")),
]}


def _category_spec(spec: Any) -> Category:
    if isinstance(spec, Category):
        return spec
    if isinstance(spec, str):
        if spec not in BUILTIN_CATEGORIES:
            raise InvalidInputError(f"unknown prompt category {spec!r}; built in: {', '.join(BUILTIN_CATEGORIES)}, "
                                    "or give {'name', 'values', 'templates', 'questions'}")
        return BUILTIN_CATEGORIES[spec]
    if not isinstance(spec, dict) or not isinstance(spec.get("values"), list) or not spec["values"]:
        raise InvalidInputError("a prompt category is a built-in name or {'name': ..., 'values': [...], "
                                "'templates': [...], 'questions': [...]} with at least one value")
    texts = [spec.get(k, []) for k in ("templates", "questions")]
    if not all(isinstance(t, list) and all(isinstance(s, str) and s.strip() for s in t) for t in texts) \
            or not any(texts):
        raise InvalidInputError(f"prompt category {spec.get('name', 'custom')!r} needs templates or questions "
                                "(lists of non-empty prompt texts)")
    return Category(str(spec.get("name", "custom")), tuple(map(str, spec["values"])), tuple(texts[0]),
                    tuple(texts[1]))


def category_tokens(tokenizer: Any, category: Any, d_vocab: int) -> dict[int, str]:
    """The single-token words of a category: `{token id of " " + value: value}`
    (InvalidInputError naming the category when none is one token)."""
    cat = _category_spec(category)
    out: dict[int, str] = {}
    for value in cat.values:
        ids = tokenizer(" " + value, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and ids[0] < d_vocab and (tokenizer.unk_token_id is None or ids[0] != tokenizer.unk_token_id):
            out.setdefault(int(ids[0]), value)
    if not out:
        raise InvalidInputError(f"prompt category {cat.name!r} yields no single-token targets: none of its values "
                                f"({', '.join(cat.values[:6])}) is one token after a space")
    return out


@dataclass
class TargetClass:
    """The category of a target and the siblings of its tokens (empty when none applies)."""

    category: Category | None
    sibling_ids: list[int] = field(default_factory=list)


def target_class(tokenizer: Any, token_ids: Sequence[int], d_vocab: int, kind: str,
                 category: Any = None) -> TargetClass:
    """The category named (`category`) or, for a token target, the built-in one listing a
    target token; siblings only for a token target (a concept is the whole class)."""
    if category is not None:
        cat = _category_spec(category)
        words = category_tokens(tokenizer, cat, d_vocab)
    else:
        cat, words = None, {}
        for candidate in BUILTIN_CATEGORIES.values():
            found = category_tokens(tokenizer, candidate, d_vocab)
            if any(t in found for t in token_ids):
                cat, words = candidate, found
                break
    siblings = [t for t in words if t not in token_ids] if kind == "tokens" else []
    return TargetClass(cat, siblings)


@dataclass
class PromptSet:
    """Prompts as token ids (BOS first, ragged), each with its style."""

    tokens: list[torch.Tensor]
    styles: list[str]

    def __len__(self) -> int:
        return len(self.tokens)

    def of_style(self, style: str) -> list[int]:
        """Indices of the prompts of `style`."""
        return [i for i, s in enumerate(self.styles) if s == style]

    def __add__(self, other: PromptSet) -> PromptSet:
        return PromptSet(self.tokens + other.tokens, self.styles + other.styles)


def text_prompts(handle: ModelHandle, texts: Sequence[str], style: str) -> PromptSet:
    """`texts` as prompts of `style` (BOS prepended)."""
    return PromptSet([handle.to_tokens(t)[0].cpu() for t in texts], [style] * len(texts))


def read_user_prompts(source: str | Path | Sequence[str]) -> list[str]:
    """The user's prompts: a list, or a file (a JSON list of strings, else one per line);
    blank ones are dropped. InvalidInputError when none is usable or one is too long."""
    where = "the prompt list"
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise InvalidInputError(f"prompts file {str(path)!r} does not exist")
        where = f"prompts file {str(path)!r}"
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            loaded = json.loads(text)
        except ValueError:
            loaded = text.splitlines()
        if not isinstance(loaded, list):
            loaded = text.splitlines()
        source = [str(x) for x in loaded]
    prompts = [p.rstrip() for p in source if isinstance(p, str) and p.strip()]
    if not prompts:
        raise InvalidInputError(f"{where} has no usable prompts (every line is blank); give one prompt per line or "
                                "a JSON list of prompt texts")
    if len(prompts) > MAX_USER_PROMPTS:
        raise InvalidInputError(f"{where} has {len(prompts)} prompts; at most {MAX_USER_PROMPTS}")
    long = next((p for p in prompts if len(p) > MAX_PROMPT_CHARS), None)
    if long is not None:
        raise InvalidInputError(f"{where}: a prompt is longer than {MAX_PROMPT_CHARS} characters ({long[:40]!r}...)")
    return prompts


@dataclass(frozen=True)
class SetSpec:
    """What goes into the ranking and the confirmation sets."""

    n_rank: int  # neutral prompts to rank on
    n_confirm: int  # neutral prompts to confirm on
    prompt_tokens: int
    rank_seed: int
    confirm_seed: int
    avoid: tuple[tuple[int, int, int], ...]  # (n, tokens, seed) draws of the steering tables
    styles: tuple[PromptStyle, ...] = ("neutral", "in_context", "question", "user")


def heldout_prompts(handle: ModelHandle, n: int, n_tokens: int, seed: int,
                    avoid: Sequence[tuple[int, int, int]]) -> torch.Tensor:
    """`n` neutral prompts of `n_tokens` drawn with `seed`, none equal to a prompt of the
    draws `avoid` (`(n, n_tokens, seed)` each: the steering tables')."""
    import torch

    from sae_atlas.saes.intervene.output_scores import neutral_prompts

    if any(s == seed for _, _, s in avoid):
        raise InvalidInputError(f"seed {seed} drew the steering table's prompts; held-out prompts need another seed")
    seen = {tuple(row.tolist()) for a_n, a_t, a_s in avoid if a_t == n_tokens
            for row in neutral_prompts(handle, a_n, a_t, a_s)}
    drawn = neutral_prompts(handle, n + len(seen), n_tokens, seed)
    return torch.stack([row for row in drawn if tuple(row.tolist()) not in seen][:n])


def split_sets(handle: ModelHandle, spec: SetSpec, cls: TargetClass,
               user_prompts: Sequence[str] = ()) -> tuple[PromptSet, PromptSet]:
    """The ranking and the confirmation sets (module docstring); InvalidInputError when the
    confirmation set would hold fewer than `MIN_CONFIRM_PROMPTS` prompts, or a style asked
    for has none."""
    if spec.rank_seed == spec.confirm_seed:
        raise InvalidInputError(f"the ranking and confirmation prompts need different seeds, both are {spec.rank_seed}")
    if spec.n_confirm == 1 or (spec.n_confirm == 0 and spec.styles == ("neutral",)):
        raise InvalidInputError(f"the confirmation set would hold {spec.n_confirm} prompt(s): a ranking is confirmed "
                                f"on at least {MIN_CONFIRM_PROMPTS} held-out prompts")
    rank, confirm = PromptSet([], []), PromptSet([], [])
    if "neutral" in spec.styles:
        ranked = heldout_prompts(handle, spec.n_rank, spec.prompt_tokens, spec.rank_seed, spec.avoid)
        rank += PromptSet(list(ranked), ["neutral"] * len(ranked))
        if spec.n_confirm:
            avoid = (*spec.avoid, (spec.n_rank, spec.prompt_tokens, spec.rank_seed))
            held = heldout_prompts(handle, spec.n_confirm, spec.prompt_tokens, spec.confirm_seed, avoid)
            confirm += PromptSet(list(held), ["neutral"] * len(held))
    if cls.category is not None:
        for style, texts in (("in_context", cls.category.templates), ("question", cls.category.questions)):
            if style in spec.styles and texts:
                rank += text_prompts(handle, texts[0::2], style)
                confirm += text_prompts(handle, texts[1::2], style)
    if "user" in spec.styles and user_prompts:
        prompts = read_user_prompts(user_prompts)
        if len(prompts) < 2 * MIN_CONFIRM_PROMPTS:
            raise InvalidInputError(f"{len(prompts)} user prompt(s): half rank and half confirm, so the confirmation "
                                    f"set would hold {len(prompts) // 2}; give at least {2 * MIN_CONFIRM_PROMPTS}")
        rank += text_prompts(handle, prompts[0::2], "user")
        confirm += text_prompts(handle, prompts[1::2], "user")
    if len(confirm) < MIN_CONFIRM_PROMPTS:
        raise InvalidInputError(f"the confirmation set holds {len(confirm)} prompt(s) (styles "
                                f"{', '.join(spec.styles)}): a ranking is confirmed on at least "
                                f"{MIN_CONFIRM_PROMPTS} held-out prompts")
    if not len(rank):
        raise InvalidInputError(f"no ranking prompts for styles {', '.join(spec.styles)}")
    return rank, confirm
