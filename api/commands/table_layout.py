"""The CLI's tables at any width.

On a terminal of at least `WIDE` columns a table is drawn in full (boxed; long text wraps
inside its cell). Otherwise (output piped or redirected, or a narrow terminal) it is
compact: one line per row, numbers and other one-word values never split, longer text cut
with an ellipsis, and the right-most columns that do not fit left out and named under the
table (`--json` prints everything). When that would leave out half the columns or more, each
row is printed as a record instead: its first value, then `column value` pairs filling the
width, a pair never split.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

WIDE = 100
"""Terminal columns from which tables are drawn in full."""
GAP = 3
"""Columns between two cells of a compact table (padding, rule, padding)."""
MIN_TEXT = 12
"""Narrowest a text column is cut to before columns to its right are left out."""
HEADER = 10
"""Columns a header may fold down to (headers are not values)."""


def cell_text(value: Any) -> str:
    """How a value is shown in a cell: floats with 4 significant digits, None empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclass
class _Column:
    header: str
    cells: list[str]

    @property
    def atomic(self) -> bool:
        """One word per cell (numbers, ids, tokens): never split or cut."""
        return all(" " not in c for c in self.cells)

    @property
    def natural(self) -> int:
        return max([len(self.header), *(len(c) for c in self.cells)])

    @property
    def least(self) -> int:
        """The narrowest this column may be: its longest value when atomic, else MIN_TEXT
        (or less when everything fits); a longer header folds, down to HEADER columns."""
        header_word = max((len(w) for w in self.header.split()), default=0)
        body = max((len(c) for c in self.cells), default=0)
        body = body if self.atomic else min(body, MIN_TEXT)
        return max(body, min(header_word, max(body, HEADER)))


def _fit(columns: list[_Column], width: int) -> tuple[list[int], list[int]]:
    """(indices of the columns shown, their widths) for a compact table `width` wide: columns
    in order while their least widths fit, the room left given to the text columns."""
    shown: list[int] = []
    used = 0
    for i, column in enumerate(columns):
        need = min(column.least, width) + (GAP if shown else 0)
        if shown and used + need > width:
            break
        shown.append(i)
        used += need
    widths = [min(columns[i].least, width) for i in shown]
    spare = width - used
    for slot, i in enumerate(shown):  # widen text columns towards their natural width, left first
        extra = min(spare, columns[i].natural - widths[slot])
        if extra > 0:
            widths[slot] += extra
            spare -= extra
    return shown, widths


def _compact(columns: list[_Column], n_rows: int, width: int) -> Table:
    shown, widths = _fit(columns, width)
    hidden = [c.header for i, c in enumerate(columns) if i not in shown]
    caption = f"not shown at {width} columns: {', '.join(hidden)} (--json has them)" if hidden else None
    table = Table(caption=caption, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                  caption_justify="left")
    for i, w in zip(shown, widths, strict=True):
        table.add_column(Text(_fold_header(columns[i].header, w), overflow="fold", no_wrap=False), width=w, no_wrap=True,
                         overflow="ellipsis", justify="right" if _numeric(columns[i].cells) else "left")
    for r in range(n_rows):
        table.add_row(*(columns[i].cells[r] for i in shown))
    return table


def _fold_header(header: str, width: int) -> str:
    """A header broken into lines of at most `width` after spaces or underscores where it can
    be (rich folds what is still too long)."""
    parts = re.findall(r"[^ _]+[ _]*", header) or [header]
    lines = [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + len(part.rstrip()) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(line.rstrip() for line in lines)


def _records(console: Console, title: str, columns: list[_Column], n_rows: int, width: int) -> None:
    """Each row as its first value, then `column value` pairs packed into lines of `width`
    (indented by two; a text value too long for a line is cut with an ellipsis)."""
    console.print(title, markup=False, highlight=False, soft_wrap=True)
    room = width - 2
    for r in range(n_rows):
        console.print(columns[0].cells[r], markup=False, highlight=False, soft_wrap=True)
        lines: list[str] = []
        for column in columns[1:]:
            value = column.cells[r]
            if not value:
                continue
            pair = f"{column.header} {value}"
            if len(pair) > room and not column.atomic:
                pair = pair[: room - 1] + "…"
            if lines and len(lines[-1]) + 3 + len(pair) <= room:
                lines[-1] += "   " + pair
            else:
                lines.append(pair)
        for line in lines:
            console.print("  " + line, markup=False, highlight=False, soft_wrap=True)


def _numeric(cells: Sequence[str]) -> bool:
    def number(text: str) -> bool:
        try:
            float(text)
        except ValueError:
            return False
        return True

    return bool(cells) and all(number(c) for c in cells if c)


def _full(title: str, columns: list[_Column], n_rows: int) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column.header, overflow="fold", no_wrap=column.atomic and column.natural <= 24,
                         justify="right" if _numeric(column.cells) else "left")
    for r in range(n_rows):
        table.add_row(*(column.cells[r] for column in columns))
    return table


def render_table(console: Console, title: str, headers: Sequence[str], rows: Iterable[Iterable[Any]]) -> None:
    """Print `rows` under `headers`: in full on a wide terminal, else compact (see module)."""
    body = [[cell_text(v) for v in row] for row in rows]
    wide = console.is_terminal and console.width >= WIDE
    if not wide:
        body = [[" ".join(c.split()) for c in row] for row in body]  # one line per cell
    columns = [_Column(str(h), [row[i] if i < len(row) else "" for row in body]) for i, h in enumerate(headers)]
    if wide:
        console.print(_full(title, columns, len(body)))
    elif len(columns) > 2 and 2 * len(_fit(columns, console.width)[0]) <= len(columns):
        _records(console, title, columns, len(body), console.width)
    else:  # the title on its own line: a table's title would wrap at the table's width
        console.print(title, markup=False, highlight=False)
        console.print(_compact(columns, len(body), console.width), crop=False)
