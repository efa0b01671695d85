"""Encode a hook's cached activations with an SAE into a sparse feature-activation matrix."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.sae.base import SAE
from sae_atlas.store.activations import ActivationReader, Split


@torch.inference_mode()
def sae_activation_matrix(
    sae: SAE,
    reader: ActivationReader,
    *,
    split: Split = "heldout",
    max_tokens: int | None = None,
    exclude_bos: bool = True,
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Encode a hook's cached activations (`ActivationReader.rows`, in cache order) into a
    CSR matrix `[tokens, d_sae]` of feature activations (non-zeros only) and the token ids."""
    chunks, ids = [], []
    for rows in reader.rows(split, max_tokens=max_tokens, exclude_bos=exclude_bos):
        f = sae_codes(sae, rows.acts).float().cpu().numpy()
        chunks.append(sp.csr_matrix(np.where(f > 0, f, 0.0).astype(np.float32)))
        ids.append(rows.token_ids.numpy())
    if sum(len(i) for i in ids) == 0:
        raise InvalidInputError(f"no tokens in split {split!r} of hook {reader.hook!r}")
    return sp.vstack(chunks, format="csr"), np.concatenate(ids)
