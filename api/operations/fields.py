"""Field types shared by the operations' parameter objects (and the HTTP bodies built on
them): JSON integers, ids as the store accepts them, prompts with a non-space character."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from sae_atlas.api.bounds import MAX_INDEX, MAX_PROMPT_CHARS, MAX_TEXT_CHARS
from sae_atlas.store.layout import ID_PATTERN, MAX_ID_LENGTH


def integral(value: Any) -> Any:
    """A JSON number with no fraction (`3.0`) as an int, also inside lists and objects;
    anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [integral(item) for item in value]
    if isinstance(value, dict):
        return {key: integral(item) for key, item in value.items()}
    return value


JsonInt = Annotated[int, BeforeValidator(integral)]
"""An integer as JSON Schema means it: `3` or `3.0`, never `true` or `"3"` (in a strict model)."""
Index = Annotated[int, Field(ge=0, le=MAX_INDEX), BeforeValidator(integral)]
"""A latent index or token id inside a list or tuple (the bounds before the JSON-integer
validator, so that the schema states them as minimum / maximum)."""
SafeId = Annotated[str, Field(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN)]
"""An id as `store.layout.check_id` accepts it (SAE id, analysis kind or run)."""
PY_WHITESPACE = "\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""Python's whitespace as a regex character class body (what `str.strip` removes)."""
Prompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS, pattern=f"[^{PY_WHITESPACE}]",
                              description="the prompt (at least one non-space character)")]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS, pattern=f"[^{PY_WHITESPACE}]",
                            description="a text with at least one non-space character")]
"""A text to search or contrast (at least one non-space character)."""
