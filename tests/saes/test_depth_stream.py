"""The depth stream on a tiny model: one pass gives CKA sums equal to the in-memory CKA of
the same token states, a seeded subsample, and lens scores per layer; bad layers are clear."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.cka import debiased_cka
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.depth.capture import check_layers, stream_depth
from sae_atlas.saes.models import tiny_model

CORPUS = CorpusSpec(context_size=32)
REPO = Path(__file__).resolve().parents[2]


def dist_stream(ctx=None):
    """The stream both sides of the two-rank test run (the worker imports it)."""
    return stream_depth(tiny_model(arch="llama", n_layers=4, seed=3), CORPUS, [0, 1, 2, 3], n_tokens=32 * 16,
                        batch_blocks=2, max_points=120, fit_fraction=0.5, progress=False, ctx=ctx)


@pytest.fixture(scope="module")
def handle():
    return tiny_model(arch="llama", n_layers=4, seed=3)


def test_streamed_cka_equals_in_memory_over_the_same_tokens(handle):
    s = stream_depth(handle, CORPUS, [0, 1, 2, 3], n_tokens=32 * 8, batch_blocks=2, max_points=10_000,
                     progress=False)
    assert len(s.states) == s.n_tokens == s.cka.n  # every token kept: the subsample is the whole stream
    assert s.states.shape[1:] == (4, handle.d_model) and (s.position > 0).all()  # BOS left out
    expected = np.array([[debiased_cka(s.states[:, i], s.states[:, j]) for j in range(4)] for i in range(4)])
    assert np.allclose(s.cka.result(), expected, atol=1e-6)
    assert {(r["lens"], r["layer"]) for r in s.lens.table()} == {(k, i) for k in ("logit", "tuned") for i in range(4)}


def test_subsample_is_seeded_and_bounded(handle):
    runs = [stream_depth(handle, CORPUS, [1, 2, 3], n_tokens=32 * 8, batch_blocks=2, max_points=50, seed=seed,
                         progress=False) for seed in (0, 0, 1)]
    assert all(len(r.states) == 50 for r in runs)
    assert np.array_equal(runs[0].states, runs[1].states) and not np.array_equal(runs[0].block * 32 + runs[0].position,
                                                                                  runs[2].block * 32 + runs[2].position)
    # layers 1-3 only: the last layer still feeds the lenses, only the requested layers are scored
    assert {r["layer"] for r in runs[0].lens.table()} == {1, 2, 3}


def test_bad_layers_and_too_few_batches_are_clear_errors(handle):
    with pytest.raises(InvalidInputError, match=r"has layers 0\.\.3; the requested layer range includes \[4, 5\]"):
        check_layers(handle, [2, 3, 4, 5])
    with pytest.raises(InvalidInputError, match="at least 3 layers"):
        check_layers(handle, [1, 2])
    with pytest.raises(InvalidInputError, match="one held out"):
        stream_depth(handle, CORPUS, [0, 1, 2], n_tokens=32 * 2, batch_blocks=2, progress=False)


def test_two_ranks_merge_to_one_process(tmp_path: Path):
    out = tmp_path / "dist.npz"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.saes.depth_dist_worker", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two, one = np.load(out), dist_stream()
    # the subsample and the CKA sums merge exactly; the tuned lens fits on each rank's first half
    assert np.array_equal(two["block"], one.block) and np.array_equal(two["position"], one.position)
    assert np.allclose(two["states"], one.states, atol=1e-5)
    assert np.allclose(two["cka"], one.cka.result(), atol=1e-9) and int(two["n_tokens"]) == one.n_tokens
    per_key = len(one.lens.n)  # (lens, layer) pairs: every held-out token is scored once per pair
    assert int(two["lens_n"]) // per_key + int(two["fit_n"]) == sum(one.lens.n.values()) // per_key + one.tuned.n_fit
