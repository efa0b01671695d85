"""HTML pieces of the results' notebook views (`_repr_html_`).

Example tokens are highlighted with a background whose opacity is the token's activation
relative to the example's maximum, like Neuronpedia's activation text.
"""

from __future__ import annotations

import html
from typing import Any


def escape(value: Any) -> str:
    """`value` as HTML-escaped text."""
    return html.escape(str(value))


def format_value(value: Any) -> str:
    """A table cell: floats to 4 significant digits, None as a dash, the rest escaped."""
    if value is None:
        return "&ndash;"
    return f"{value:.4g}" if isinstance(value, float) else escape(value)


def rows_table(rows: list[dict[str, Any]] | None, columns: list[str]) -> str:
    """`rows` as a small HTML table of `columns` (<i>none</i> when there are no rows)."""
    if not rows:
        return "<i>none</i>"
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{format_value(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f'<table style="font-size:90%"><tr>{head}</tr>{body}</table>'


def highlight_tokens(tokens: list[str], acts: list[float], scale: float | None = None) -> str:
    """HTML spans of `tokens` with an orange background proportional to `acts / scale`."""
    top = scale if scale else max([a for a in acts if a is not None] + [1e-9])
    spans = []
    for tok, act in zip(tokens, acts, strict=False):
        alpha = 0.0 if not act or top <= 0 else min(1.0, max(0.0, act / top))
        title = f"{act:.3g}" if act is not None else ""
        spans.append(f'<span title="{title}" style="background:rgba(255,140,0,{alpha:.2f});'
                     f'padding:0 1px;border-radius:2px">{escape(tok)}</span>')
    return "".join(spans)


def signed_tokens(tokens: list[str], values: list[float]) -> str:
    """HTML spans of `tokens`, red for positive and blue for negative values (opacity
    relative to the largest magnitude), the value in the tooltip."""
    top = max([abs(v) for v in values] + [1e-12])
    spans = []
    for tok, v in zip(tokens, values, strict=False):
        a = min(1.0, abs(v) / top)
        rgb = "220,50,47" if v >= 0 else "38,139,210"
        spans.append(f'<span title="{v:.4g}" style="background:rgba({rgb},{a:.2f});padding:0 1px;'
                     f'border-radius:2px">{escape(tok)}</span>')
    return "".join(spans)
