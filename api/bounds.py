"""The limits that keep one request cheap, for Python, the CLI and HTTP alike.

The facade checks them (`check_int`); the HTTP request models and query parameters import
the same constants, so `/openapi.json` states exactly what the facade accepts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sae_atlas.errors import InvalidInputError

MAX_K = 100
"""Results of a search, neighbours on a feature page."""
MAX_EXAMPLES = 50
"""Example contexts on a feature page."""
MAX_TEXT_CHARS = 2000
"""Characters of a text to search (`search_text`) or of one text of a contrast."""
MAX_TEXTS = 1000
"""Texts in one set of a contrast (Python; HTTP bodies hold at most `MAX_TEXTS_PER_SET`)."""
MAX_TEXTS_PER_SET = 256
MAX_HTTP_PERMUTATIONS = 100_000
"""Permutations of a contrast's p-values over HTTP (`geometry.contrast` bounds Python)."""
MAX_SPAN = 32
"""Features of a concept's span."""
MAX_PROMPTS = 4096
"""Prompts a concept may render."""
MAX_VECTOR = 65536
"""Entries of a search vector."""
MAX_SAES_PER_QUERY = 64
MAX_INDEX = 2**31 - 1
"""Largest latent index or token id a request may name."""
MAX_LIST = 1000
"""Rows of one page of the per-latent table."""

MAX_PROMPT_TOKENS = 256
"""Tokens of an intervention prompt (BOS included)."""
MAX_PROMPT_CHARS = 16 * MAX_PROMPT_TOKENS
MAX_NEW_TOKENS = 64
MAX_EDITS = 16
MAX_TEMPERATURE = 10.0
MAX_NEXT_TOKENS = 50
"""Next-token predictions listed by a run."""
MAX_ATTRIBUTED = 200
"""Features listed by an attribution."""
MAX_VERIFIED = 20
"""Top attributed features checked by true ablation."""
MAX_GRAPH_TOKENS = 64
"""Tokens of an attribution-graph prompt (BOS included): its backward passes grow with them."""
MAX_GRAPH_FEATURES = 20_000
"""Active features of one attribution graph (one adjacency row each)."""
MAX_GRAPH_TARGETS = 10
"""Logit nodes of one attribution graph."""
MAX_GRAPH_NODE_EDITS = 8
"""Interventions on graph nodes in one request."""


def check_int(value: Any, what: str, lo: int, hi: int) -> int:
    """`value` as an int if it is an integer (not a bool) in `lo..hi`, else InvalidInputError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise InvalidInputError(f"{what} must be an integer in {lo}..{hi}, got {value!r}")
    return int(value)


def check_k(k: Any, what: str = "k", maximum: int = MAX_K) -> int:
    """`k` if it is an integer in 1..maximum, else InvalidInputError."""
    return check_int(k, what, 1, maximum)
