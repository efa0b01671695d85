"""Encoding cached activations into a sparse matrix: rows in cache order, BOS left out, capped."""

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.cached import sae_activation_matrix
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.activations import ActivationReader
from tests.store.test_activations import HOOK, write_cache


def test_matrix_matches_encoding_the_non_bos_rows(tmp_path):
    acts, toks = write_cache(tmp_path, n_blocks=10, t=4, d=8)
    sae = build_sae(SAEConfig("topk", 8, 16, k=3)).eval()
    reader = ActivationReader(tmp_path, HOOK)
    matrix, token_ids = sae_activation_matrix(sae, reader, split="all", max_tokens=25)
    rows = acts[:, 1:].reshape(-1, 8)[:25]
    with torch.no_grad():
        expected = sae.encode(rows).clamp_min(0).numpy()
    assert matrix.shape == (25, 16) and np.allclose(matrix.toarray(), expected)
    assert token_ids.tolist() == toks[:, 1:].reshape(-1)[:25].tolist()
    assert (matrix.getnnz(axis=1) <= 3).all()
    with pytest.raises(InvalidInputError, match="max_tokens must be positive"):
        sae_activation_matrix(sae, reader, max_tokens=0)
