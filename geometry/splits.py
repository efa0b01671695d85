"""Seeded train/test splits, one rule for all: from one permutation of the rows, hold out
`round(n * test_frac)` of them, at least 1 and at most `n - 2` (so 2 rows always train);
per label for a stratified split."""

from __future__ import annotations

import numpy as np

from sae_atlas.errors import InvalidInputError


def split_rows(n: int, test_frac: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`(train, test)` positions of `n` rows from one permutation drawn from `rng`: its first
    `round(n * test_frac)` are held out (at least 1, at most n - 2); nothing is held out when
    `test_frac` is 0. InvalidInputError when `test_frac` is outside [0, 1), or positive with
    fewer than 3 rows."""
    if not 0 <= test_frac < 1:
        raise InvalidInputError(f"test_frac must be in [0, 1), got {test_frac}")
    if test_frac > 0 and n < 3:
        raise InvalidInputError(f"a held-out split needs >= 3 rows (2 to train, 1 to test), got {n}")
    perm = rng.permutation(n)
    n_test = min(max(int(round(n * test_frac)), 1), n - 2) if test_frac > 0 else 0
    return perm[n_test:], perm[:n_test]


def stratified_split(labels: np.ndarray, test_frac: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`split_rows` within each label (in sorted label order), so every label keeps >= 2
    training rows and >= 1 test row; InvalidInputError for a label with fewer than 3 rows
    or `test_frac` outside (0, 1)."""
    if not 0 < test_frac < 1:
        raise InvalidInputError(f"test_frac must be in (0, 1), got {test_frac}")
    train, test = [], []
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        if len(rows) < 3:
            raise InvalidInputError(f"relation {label.item()!r} has {len(rows)} pairs; each needs at least 3")
        tr, te = split_rows(len(rows), test_frac, rng)
        train.append(rows[tr])
        test.append(rows[te])
    return np.concatenate(train), np.concatenate(test)
