"""Cyclic concept prompt sets and activations at the concept token.

An `OrderedConcept` is an ordered list of values (weekdays, months, or a user's own set)
plus prompt templates with a `{value}` slot and, optionally, an `{offset}` slot for
"k steps from value" arithmetic prompts whose answer is value `(a + k) mod p`. The built-in
sets follow Engels et al. 2024: 49 prompts "Let's do some days of the week math.
{Two days} from {Monday} is" and 144 prompts "Let's do some calendar math. {Three months}
from {March} is".

The concept token is found by searching the tokenized prompt (character offsets of the
value), never by a fixed index. `run_prompts` does one forward pass per batch, capturing
any hooks at the concept token and, if asked, the logits at the last prompt token, with an
optional replacement of the concept token's activation at one hook (used by
`saes.intervene.answers`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.hook_fns import capture_hook, in_residual, replace_hook
from sae_atlas.saes.models import ModelHandle

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]
_NUMBERS = ["One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten",
            "Eleven", "Twelve"]


@dataclass(frozen=True)
class ConceptPrompt:
    """One rendered prompt: its concept value, offset (steps) and answer value."""

    text: str
    value: int
    span: tuple[int, int]  # character span of the value in `text`
    template: int
    offset: int | None = None
    answer: int | None = None


@dataclass
class OrderedConcept:
    """An ordered cyclic set of values with prompt templates (see the module docstring).

    `offsets[i]` is the phrase for a shift of `i + 1` steps (e.g. "Two days" for 2); when
    templates contain `{offset}`, every (offset, value) pair becomes one prompt.
    """

    name: str
    values: list[str]
    templates: list[str]
    offsets: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.values) < 3 or len(set(self.values)) != len(self.values):
            raise InvalidInputError(f"concept {self.name!r} needs >= 3 distinct values, got {self.values}")
        if not self.templates:
            raise InvalidInputError(f"concept {self.name!r} needs at least one template")
        for t in self.templates:
            if t.count("{value}") != 1:
                raise InvalidInputError(f"template {t!r} must contain '{{value}}' exactly once")
            if ("{offset}" in t) != bool(self.offsets):
                raise InvalidInputError(
                    f"template {t!r}: use '{{offset}}' exactly when offsets are given ({len(self.offsets)})"
                )

    @property
    def period(self) -> int:
        return len(self.values)

    def prompts(self) -> list[ConceptPrompt]:
        """All rendered prompts: templates x offsets x values, values varying fastest."""
        out = []
        shifts: list[int | None] = list(range(1, len(self.offsets) + 1)) or [None]
        for ti, template in enumerate(self.templates):
            for shift in shifts:
                for vi, value in enumerate(self.values):
                    head, tail = template.split("{value}")
                    if shift is not None:
                        phrase = self.offsets[shift - 1]
                        head, tail = head.replace("{offset}", phrase), tail.replace("{offset}", phrase)
                    answer = None if shift is None else (vi + shift) % self.period
                    out.append(ConceptPrompt(head + value + tail, vi, (len(head), len(head) + len(value)),
                                             ti, shift, answer))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "values": self.values, "templates": self.templates, "offsets": self.offsets}


def weekdays() -> OrderedConcept:
    """The 49 weekday-arithmetic prompts of Engels et al. 2024."""
    offsets = ["One day"] + [f"{n} days" for n in _NUMBERS[1:7]]
    return OrderedConcept("weekdays", WEEKDAYS, ["Let's do some days of the week math. {offset} from {value} is"], offsets)


def months() -> OrderedConcept:
    """The 144 month-arithmetic prompts of Engels et al. 2024."""
    offsets = ["One month"] + [f"{n} months" for n in _NUMBERS[1:12]]
    return OrderedConcept("months", MONTHS, ["Let's do some calendar math. {offset} from {value} is"], offsets)


@dataclass
class CategoryConcept:
    """An unordered set of values (categories: colours, animals, ...) with prompt templates
    holding one `{value}` slot; each (template, value) pair is one prompt."""

    name: str
    values: list[str]
    templates: list[str]

    def __post_init__(self) -> None:
        if len(self.values) < 2 or len(set(self.values)) != len(self.values):
            raise InvalidInputError(f"categories {self.name!r} need >= 2 distinct values, got {self.values}")
        if not self.templates:
            raise InvalidInputError(f"categories {self.name!r} need at least one template")
        for t in self.templates:
            if t.count("{value}") != 1 or "{offset}" in t:
                raise InvalidInputError(f"template {t!r} must contain '{{value}}' exactly once and no '{{offset}}'")

    def prompts(self) -> list[ConceptPrompt]:
        """All rendered prompts: templates x values, values varying fastest."""
        out = []
        for ti, template in enumerate(self.templates):
            head, tail = template.split("{value}")
            out.extend(ConceptPrompt(head + value + tail, vi, (len(head), len(head) + len(value)), ti)
                       for vi, value in enumerate(self.values))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "categories", "values": self.values, "templates": self.templates}


def colours() -> CategoryConcept:
    """Eight colour words in five everyday templates."""
    return CategoryConcept("colours", ["red", "blue", "green", "yellow", "black", "white", "purple", "brown"], [
        "The car was painted {value}.", "She wore a {value} dress to the party.", "My favourite colour is {value}.",
        "The walls of the room are {value}.", "He bought a {value} bicycle yesterday."])


def numbers() -> CategoryConcept:
    """The number words one..twelve (as in the built-in corpus) in five counting templates."""
    return CategoryConcept("numbers", [n.lower() for n in _NUMBERS], [
        "There are {value} books on the shelf.", "She counted {value} birds in the tree.",
        "We waited {value} hours for the train.", "The box holds {value} apples.", "I bought {value} tickets."])


BUILTIN_CONCEPTS = {"weekdays": weekdays, "months": months}
BUILTIN_CATEGORIES = {"colours": colours, "numbers": numbers}


def control_words(concept: OrderedConcept | CategoryConcept, n: int | None = None) -> list[str]:
    """`n` (default: as many as the concept has values, at least 3) everyday nouns of the
    built-in corpus that are none of the concept's values, alternating across categories
    (animals, fish, fruit, countries, tools...; colours left out); capitalised when most of
    the concept's values are (weekdays, months), so that case does not tell them apart."""
    from sae_atlas.saes.builtin_text import CATEGORIES

    taken = {v.lower() for v in concept.values}
    pools = [[w for w in words if w.lower() not in taken] for name, words in CATEGORIES.items() if name != "colour"]
    mixed = [w for group in zip(*(p[:6] for p in pools), strict=False) for w in group]
    n = max(3, len(concept.values)) if n is None else n
    if not 2 <= n <= len(mixed):
        raise InvalidInputError(f"control words: ask for 2..{len(mixed)}, got {n}")
    if sum(v[:1].isupper() for v in concept.values) * 2 > len(concept.values):
        mixed = [w[:1].upper() + w[1:] for w in mixed]
    return mixed[:n]


def control_concept(concept: OrderedConcept | CategoryConcept, words: list[str] | None = None
                    ) -> OrderedConcept | CategoryConcept:
    """The concept's prompts with `words` (default `control_words`) in the value's place: the
    same templates and offsets, so only the value token differs from the concept's prompts."""
    words = control_words(concept) if words is None else words
    if isinstance(concept, CategoryConcept):
        return CategoryConcept(f"{concept.name}-controls", words, concept.templates)
    return OrderedConcept(f"{concept.name}-controls", words, concept.templates, concept.offsets)


def load_concept(spec: str | Path | dict[str, Any], *, categories: bool = False) -> OrderedConcept | CategoryConcept:
    """A built-in concept by name, or a user set from a dict / JSON file with keys `name`,
    `values`, `templates` and optionally `offsets`; `"kind": "categories"` (or a built-in
    category set) makes it an unordered `CategoryConcept`, allowed only when `categories`."""
    concept = _read_concept(spec)
    if isinstance(concept, CategoryConcept) and not categories:
        raise InvalidInputError(f"concept {concept.name!r} is an unordered set of categories; this needs an ordered one")
    return concept


def _read_concept(spec: str | Path | dict[str, Any]) -> OrderedConcept | CategoryConcept:
    if isinstance(spec, str) and spec in BUILTIN_CONCEPTS:
        return BUILTIN_CONCEPTS[spec]()
    if isinstance(spec, str) and spec in BUILTIN_CATEGORIES:
        return BUILTIN_CATEGORIES[spec]()
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_file():
            raise InvalidInputError(
                f"unknown concept {str(spec)!r}: use {', '.join([*BUILTIN_CONCEPTS, *BUILTIN_CATEGORIES])} or a JSON file"
            )
        try:
            spec = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(spec, dict) or not {"values", "templates"} <= set(spec):
        raise InvalidInputError("a concept needs 'values' and 'templates' (and optionally 'name', 'kind', 'offsets')")
    if spec.get("kind", "ordered") not in ("ordered", "categories"):
        raise InvalidInputError(f"concept kind must be 'ordered' or 'categories', got {spec.get('kind')!r}")
    if spec.get("kind") == "categories":
        return CategoryConcept(str(spec.get("name", "custom")), list(spec["values"]), list(spec["templates"]))
    return OrderedConcept(
        str(spec.get("name", "custom")), list(spec["values"]), list(spec["templates"]), list(spec.get("offsets", []))
    )


@dataclass
class TokenizedPrompts:
    """Right-padded token ids with the concept and last-token positions of each prompt."""

    tokens: torch.Tensor  # [N, T] int64
    lengths: torch.Tensor  # [N] real lengths
    concept_pos: torch.Tensor  # [N] position of the concept token (last token of the value)
    prompts: list[ConceptPrompt]

    @property
    def values(self) -> torch.Tensor:
        return torch.tensor([p.value for p in self.prompts])

    @property
    def final_pos(self) -> torch.Tensor:
        return self.lengths - 1

    def __len__(self) -> int:
        return len(self.prompts)


def concept_token_position(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> int:
    """Index of the last token whose character range overlaps `span` (the value's last
    token); InvalidInputError if no token covers the value."""
    hits = [i for i, (s, e) in enumerate(offsets) if s < span[1] and e > span[0]]
    if not hits:
        raise InvalidInputError(f"no token covers characters {span} of the prompt")
    return hits[-1]


def tokenize_prompts(
    tokenizer: Any, prompts: list[ConceptPrompt], *, bos_token_id: int | None, prepend_bos: bool = True
) -> TokenizedPrompts:
    """Tokenize prompts (BOS prepended when asked and known), find each concept token by its
    character offsets, and right-pad to a common length."""
    if not prompts:
        raise InvalidInputError("no prompts to tokenize")
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidInputError("finding concept tokens needs a fast tokenizer (character offsets)")
    rows, positions = [], []
    for p in prompts:
        enc = tokenizer(p.text, add_special_tokens=False, return_offsets_mapping=True)
        ids, pos = list(enc["input_ids"]), concept_token_position(enc["offset_mapping"], p.span)
        if prepend_bos and bos_token_id is not None:
            ids, pos = [bos_token_id, *ids], pos + 1
        rows.append(ids)
        positions.append(pos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), int(pad), dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    return TokenizedPrompts(tokens, torch.tensor([len(r) for r in rows]), torch.tensor(positions), prompts)


def value_token_ids(tokenizer: Any, concept: OrderedConcept) -> list[int]:
    """First token id of `" " + value` for each value (the answer token after "is");
    InvalidInputError when two values share it (answers would be indistinguishable)."""
    ids = [tokenizer(" " + v, add_special_tokens=False)["input_ids"][0] for v in concept.values]
    if len(set(ids)) != len(ids):
        raise InvalidInputError(f"values of {concept.name!r} share first tokens {ids}; answers are ambiguous")
    return [int(i) for i in ids]


@dataclass
class Patch:
    """Replace the activation at `hook`, concept token of each prompt, with `values_ND`."""

    hook: str
    values_ND: torch.Tensor


@dataclass
class RunOutput:
    """Activations captured at the concept token per hook, and last-token logits if asked."""

    acts: dict[str, torch.Tensor]  # hook -> [N, d]
    logits: torch.Tensor | None  # [N, d_vocab]


def _patched(act_NTD: torch.Tensor, *, values_ND: torch.Tensor, pos_N: torch.Tensor) -> torch.Tensor:
    """A copy of `act_NTD` with row n's position `pos_N[n]` set to `values_ND[n]`."""
    out = act_NTD.clone()
    out[torch.arange(len(out)), pos_N] = values_ND.to(out.dtype)
    return out


def _append_at(sink: list[torch.Tensor], act_NTD: torch.Tensor, *, pos_N: torch.Tensor) -> None:
    """Append row n's activation at position `pos_N[n]` (float32, detached) to `sink`."""
    sink.append(act_NTD[torch.arange(len(act_NTD)), pos_N].detach().float().clone())


@torch.inference_mode()
def run_prompts(
    handle: ModelHandle,
    batch: TokenizedPrompts,
    *,
    capture: Sequence[str] = (),
    patch: Patch | None = None,
    logits: bool = False,
    batch_size: int = 64,
) -> RunOutput:
    """One forward pass per batch of prompts through `handle.bridge` (a ModelHandle).

    Captures each hook in `capture` at the concept token, optionally applies `patch` first,
    and returns the last-token logits when `logits=True`; without logits the pass stops
    after the deepest hook's block.
    """
    hooks = [handle.check_hook(h) for h in capture]
    if patch is not None:
        handle.check_hook(patch.hook)
        if patch.values_ND.shape != (len(batch), handle.d_model):
            raise InvalidInputError(
                f"patch values must have shape [{len(batch)}, {handle.d_model}], got {tuple(patch.values_ND.shape)}"
            )
    deepest = max([handle.hook_layer(h) for h in [*hooks, *([patch.hook] if patch else [])]] or [0])
    stop = None if logits else deepest + 1
    acts: dict[str, list[torch.Tensor]] = {h: [] for h in hooks}
    out_logits = []
    for start in range(0, len(batch), batch_size):
        sl = slice(start, start + batch_size)
        toks = batch.tokens[sl]
        width = int(batch.lengths[sl].max())
        toks = toks[:, :width]
        rows = torch.arange(len(toks))
        cpos = batch.concept_pos[sl]
        fwd_hooks = []
        if patch is not None:
            fwd_hooks.append((patch.hook, replace_hook(partial(_patched, values_ND=patch.values_ND[sl], pos_N=cpos))))
        for name in hooks:
            fwd_hooks.append((name, capture_hook(partial(_append_at, acts[name], pos_N=cpos))))
        out = handle.bridge.run_with_hooks(toks, fwd_hooks=in_residual(handle.bridge, fwd_hooks), stop_at_layer=stop)
        if logits:
            out_logits.append(out[rows, batch.final_pos[sl]].float())
    return RunOutput(
        {h: torch.cat(v) for h, v in acts.items()},
        torch.cat(out_logits) if logits else None,
    )


def collect_concept_activations(
    handle: ModelHandle, batch: TokenizedPrompts, hooks: Sequence[str], *, batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """Activations `[N, d]` at the concept token for each hook (one pass per batch)."""
    if not hooks:
        raise InvalidInputError("name at least one hook to collect")
    return run_prompts(handle, batch, capture=hooks, batch_size=batch_size).acts
