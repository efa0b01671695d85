"""A seeded bottom-k subsample kept in preallocated arrays.

Every offered row carries a random key; the reservoir keeps the `capacity` rows with the
smallest keys among all rows offered so far. An entering row is written into the slot of
one it evicts (or a free slot), so a batch costs copies of only the rows that enter, not
of everything kept. Each row also carries its insertion number: `rows()` returns the kept
rows in insertion order, the order a concatenate-then-select subsample would give.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


class Reservoir:
    """The `capacity` smallest-keyed rows offered, as columns of the given shapes and dtypes
    (`columns`: per column, the shape of one row and its dtype)."""

    def __init__(self, capacity: int, columns: Sequence[tuple[tuple[int, ...], np.dtype | type]]) -> None:
        self.capacity = capacity
        self.size = 0  # rows held
        self.offered = 0  # rows offered so far: the next row's insertion number
        self.keys = np.empty(capacity, np.float64)
        self.order = np.empty(capacity, np.int64)  # insertion number of each held row
        self.columns = [np.empty((capacity, *shape), dtype) for shape, dtype in columns]

    def offer(self, keys: np.ndarray, rows: Callable[[np.ndarray], Sequence[np.ndarray]]) -> None:
        """Offer a batch whose rows have `keys`; `rows(index)` gives every column's values
        at those batch positions (called once, for the rows that enter)."""
        n, held = len(keys), self.size
        if held + n <= self.capacity:
            entering, slots = np.arange(n), np.arange(held, held + n)
        else:
            chosen = np.argpartition(np.concatenate([self.keys[:held], keys]), self.capacity - 1)[: self.capacity]
            entering = np.sort(chosen[chosen >= held]) - held
            free = np.ones(self.capacity, bool)
            free[chosen[chosen < held]] = False  # held rows that stay
            slots = np.flatnonzero(free)[: len(entering)]  # evicted rows' slots, then never-used ones
        for column, values in zip(self.columns, rows(entering), strict=True):
            column[slots] = values
        self.keys[slots] = keys[entering]
        self.order[slots] = self.offered + entering
        self.size = min(self.capacity, held + n)
        self.offered += n

    def rows(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """`(keys, columns)` of the held rows, in insertion order."""
        by_insertion = np.argsort(self.order[: self.size], kind="stable")
        return self.keys[by_insertion], [column[by_insertion] for column in self.columns]
