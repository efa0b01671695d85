"""Row normalisation shared by the indexes, search and the geometry analyses."""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from sae_atlas.store.errors import InvalidInputError


def unit_rows(matrix_ND: np.ndarray, dtype: DTypeLike = np.float32) -> np.ndarray:
    """C-contiguous copy of the rows of a non-empty 2-D array scaled to unit L2 norm (zero
    rows stay zero), in `dtype` (float32 unless asked otherwise); InvalidInputError otherwise."""
    M = np.asarray(matrix_ND, dtype=dtype)
    if M.ndim != 2 or M.shape[0] == 0:
        raise InvalidInputError(f"expected a non-empty 2-D array of rows [N, d], got shape {M.shape}")
    norms = np.linalg.norm(M, axis=1, keepdims=True)
    return np.ascontiguousarray(M / np.maximum(norms, 1e-12), dtype=dtype)
