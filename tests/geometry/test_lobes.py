"""Lobes: planted co-occurrence groups are recovered; independent features are not."""

import numpy as np
import pytest
import scipy.sparse as sp

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.lobes import (
    binary_occurrence,
    compare_labels,
    cooccurrence_knn,
    spectral_lobes,
)


def planted_lobes(n_blocks=1500, n_lobes=4, per=50, seed=0):
    """Each block is about one topic: features of its lobe fire with p=0.3, others p=0.01."""
    rng = np.random.default_rng(seed)
    F = n_lobes * per
    truth = np.repeat(np.arange(n_lobes), per)
    topic = rng.integers(0, n_lobes, n_blocks)
    p = np.where(truth[None, :] == topic[:, None], 0.3, 0.01)
    occ = rng.random((n_blocks, F)) < p
    counts = occ * rng.integers(1, 5, occ.shape)
    return sp.csr_matrix(counts), truth


@pytest.mark.parametrize("measure", ["jaccard", "dice", "overlap", "phi"])
def test_planted_lobes_recovered(measure):
    occ, truth = planted_lobes()
    A = cooccurrence_knn(occ, measure=measure, k=15, chunk_mb=0.05)  # tiny chunks: exercise the loop
    assert (A != A.T).nnz == 0 and A.diagonal().max() == 0
    assert (np.diff(A.indptr) >= 15).all()
    labels = spectral_lobes(A, 4, seed=0)
    cmp = compare_labels(labels, truth, n_perm=20)
    assert cmp.ami > 0.95 and cmp.null_mean < 0.05 and cmp.p_value < 0.1


def test_chunking_does_not_change_the_graph():
    occ, _ = planted_lobes(n_blocks=300, per=20)
    a = cooccurrence_knn(occ, k=5, chunk_mb=0.01)
    b = cooccurrence_knn(occ, k=5)
    assert (a != b).nnz == 0
    # exact values against a dense reference on a few pairs
    B = binary_occurrence(occ).toarray()
    C = B.T @ B
    n = B.sum(0)
    r, c = a.nonzero()
    jac = C[r, c] / (n[r] + n[c] - C[r, c])
    np.testing.assert_allclose(a[r, c].A1, jac, rtol=1e-5)


def test_independent_features_give_no_lobes():
    rng = np.random.default_rng(1)
    occ = sp.csr_matrix(rng.random((1500, 200)) < 0.1)
    truth = np.repeat(np.arange(4), 50)
    labels = spectral_lobes(cooccurrence_knn(occ, measure="phi", k=15), 4, seed=0)
    assert abs(compare_labels(labels, truth, n_perm=20).ami) < 0.05
    with pytest.raises(InvalidInputError):
        cooccurrence_knn(occ, measure="cosine")
    with pytest.raises(InvalidInputError):
        compare_labels(truth, truth[:-1])
