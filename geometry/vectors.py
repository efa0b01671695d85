"""Row normalisation shared by the indexes, search, the geometry analyses and dictionary
matching."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import DTypeLike

from sae_atlas.errors import InvalidInputError

ZeroRows = Literal["keep", "refuse"]


def unit_rows(matrix_ND: np.ndarray, dtype: DTypeLike = np.float32, *, zero_rows: ZeroRows = "keep",
              what: str = "rows") -> np.ndarray:
    """C-contiguous copy of the rows of a non-empty 2-D array `[N, d]` (`what`, named in
    errors) scaled to unit L2 norm, in `dtype` (float32 unless asked otherwise).

    The zero-row rule: with `zero_rows="keep"` a zero row stays zero, so its cosine with
    every direction is 0 (a dead latent's decoder in an index, a search or a map); with
    "refuse" a zero row is an InvalidInputError (matching dictionaries, where every row must
    be a direction). InvalidInputError for anything but a non-empty 2-D array."""
    M = np.asarray(matrix_ND, dtype=dtype)
    if M.ndim != 2 or M.shape[0] == 0:
        raise InvalidInputError(f"{what} must be a non-empty 2-D array [N, d], got shape {M.shape}")
    norms = np.linalg.norm(M, axis=1, keepdims=True)
    if zero_rows == "refuse" and (norms == 0).any():
        raise InvalidInputError(f"{what} has {int((norms == 0).sum())} zero rows; directions need a norm")
    return np.ascontiguousarray(M / np.maximum(norms, 1e-12), dtype=dtype)
