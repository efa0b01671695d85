"""Comparing two SAEs: a permuted and rotated copy scores MCC 1 and SVCCA 1; SAEs on
unrelated data score at their nulls; decoder matching refuses different spaces."""

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.pairs import PairedActs
from sae_atlas.saes.compare.saes_pair import (
    CompareParams,
    compare_codes,
    decoder_match,
    stream_statistics,
)
from tests.saes.compare_fixtures import (  # noqa: F401 (one_thread: a fixture)
    one_thread,
    planted_atoms,
    planted_pairs,
    planted_sae,
    rotated_permuted_copy,
    rotation,
)

PARAMS = CompareParams(sample_tokens=512, n_perm=30, n_rotations=2, seed=0)


def test_a_permuted_rotated_copy_scores_mcc_one_and_svcca_one():
    atoms = planted_atoms(16, 48, seed=0)
    sae = planted_sae(atoms)
    R, perm = rotation(16, 1), torch.from_numpy(np.random.default_rng(2).permutation(48))
    copy = rotated_permuted_copy(sae, R, perm)
    stats = stream_statistics(sae, copy, planted_pairs(atoms, R), PARAMS)
    result = compare_codes(stats, sae.W_dec.detach().numpy(), copy.W_dec.detach().numpy(), PARAMS)
    assert result.activation.mcc == pytest.approx(1.0, abs=1e-4)
    assert (perm.numpy()[result.activation.pairs_b] == result.activation.pairs_a).all()
    assert len(result.activation.mutual_a) == 48
    assert result.activation_mcc.null_mean < 0.6 and result.activation_mcc.p_value == pytest.approx(1 / 3)
    for key in ("decoder_svcca_random_features", "activation_svcca_shuffled_tokens"):
        assert result.spaces[key].score == pytest.approx(1.0, abs=1e-6)
        assert result.spaces[key].p_value == pytest.approx(1 / 31)
    assert result.spaces["decoder_rsa_random_features"].score == pytest.approx(1.0, abs=1e-6)
    # decoder cosines are not rotation-invariant: the rotated copy matches at the rotation null's level
    assert result.decoder is not None and result.decoder.mcc < 0.7


def test_decoder_matching_of_a_permuted_copy_is_one_and_its_rotation_null_low():
    atoms = planted_atoms(16, 48, seed=0)
    perm = np.random.default_rng(3).permutation(48)
    match, null = decoder_match(atoms.numpy(), 2.0 * atoms.numpy()[perm], n_rotations=3)
    assert match.mcc == pytest.approx(1.0) and (perm[match.pairs_b] == match.pairs_a).all()
    assert null.null_mean < 0.6 and null.p_value == pytest.approx(0.25)


def test_two_saes_on_unrelated_data_score_at_their_nulls():
    atoms_a, atoms_b = planted_atoms(16, 48, seed=0), planted_atoms(16, 48, seed=9)
    sae_a, sae_b = planted_sae(atoms_a), planted_sae(atoms_b)
    pairs = (PairedActs(p.a_ND, q.a_ND) for p, q in zip(planted_pairs(atoms_a, None),
                                                         planted_pairs(atoms_b, None, seed=5), strict=True))
    stats = stream_statistics(sae_a, sae_b, pairs, PARAMS)
    result = compare_codes(stats, atoms_a.numpy(), atoms_b.numpy(), PARAMS)
    assert result.activation.mcc == pytest.approx(result.activation_mcc.null_mean, abs=0.05)
    assert result.activation.mcc < 0.3
    for key in ("activation_svcca_shuffled_tokens", "activation_rsa_shuffled_tokens"):
        assert result.spaces[key].p_value > 0.01
        assert result.spaces[key].score == pytest.approx(result.spaces[key].null_mean,
                                                        abs=4 * result.spaces[key].null_std + 0.02)


def test_decoder_matching_refuses_different_model_widths():
    with pytest.raises(InvalidInputError, match="shared d_model.*d=16.*d=24"):
        decoder_match(planted_atoms(16, 8).numpy(), planted_atoms(24, 8).numpy())


def test_no_common_tokens_is_a_clear_error():
    sae = planted_sae(planted_atoms(16, 8))
    with pytest.raises(InvalidInputError, match="0 tokens in common"):
        stream_statistics(sae, sae, iter([]), PARAMS)


def test_rare_latents_firing_together_are_left_out_of_the_matching():
    atoms = planted_atoms(16, 8, seed=0)
    a = torch.zeros(500, 8)
    a[:, :6] = torch.rand(500, 6)
    b = a[:, torch.tensor([1, 0, 3, 2, 5, 4, 7, 6])].clone()
    a[[3, 9], 6] = b[[3, 9], 7] = 5.0  # latent 6 of A and 7 of B fire on the same 2 tokens only
    from sae_atlas.saes.compare.correlation import CorrelationSums

    sums = CorrelationSums.zeros(8, 8)
    sums.update(a, b)
    assert sums.correlation()[6, 7] == pytest.approx(1.0)
    from sae_atlas.saes.compare.saes_pair import StreamedStats

    stats = StreamedStats(sums.correlation(), [], a.numpy(), b.numpy(), 500, sums.fires_a.numpy(),
                          sums.fires_b.numpy())
    result = compare_codes(stats, atoms.numpy(), atoms.numpy(), PARAMS, decoder=False)
    pairs = dict(zip(result.activation.pairs_a.tolist(), result.activation.pairs_b.tolist(), strict=True))
    assert all(pairs[i] == j for i, j in [(0, 1), (1, 0), (2, 3), (3, 2), (4, 5), (5, 4)])
    assert result.activation.pair_similarity[result.activation.pairs_a == 6][0] == 0.0
    assert result.n_rare == (2, 2)  # latent 7 of A and 6 of B never fire; 6 / 7 fire twice
