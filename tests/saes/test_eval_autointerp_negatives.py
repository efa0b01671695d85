"""Autointerp hard negatives (`negatives="similar"`): the non-activating windows of a latent
come from the examples of its nearest latent by decoder cosine (the SAE's FAISS index),
never from blocks where the occurrence matrix says the latent fires; random negatives draw
from every other latent."""

import numpy as np
import polars as pl
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.autointerp import (
    AutointerpConfig,
    NegativesSource,
    SimilarNegatives,
    autointerp_config,
)
from sae_atlas.saes.eval.autointerp_scoring import latent_examples
from sae_atlas.saes.eval.suite import run_suite
from sae_atlas.store.index import build_atlas_indexes
from sae_atlas.store.tables import FeatureTables, OccurrenceWriter, write_tables
from tests.saes.autointerp_planted import PLANTED, planted_examples, planted_features
from tests.saes.test_eval_autointerp import HOOK, no_model
from tests.store.sae_folders import write_sae

FIRED_IN_TWIN = range(1000, 1006)  # blocks of latent 1's examples where latent 0 fires too


@pytest.fixture
def atlas(tmp_path):
    """The planted single-token latents, latent 1's decoder row next to latent 0's (their
    only near pair), latent 0 firing in some of latent 1's example blocks."""
    n = len(PLANTED)
    W_dec = np.eye(n, dtype=np.float32)
    W_dec[1] = np.array([0.9, 0.44, 0, 0, 0, 0], dtype=np.float32)
    write_sae(tmp_path, "s", W_dec, HOOK)
    examples = planted_examples()
    blocks = np.sort(examples["block"].unique().to_numpy())
    counts = np.zeros((len(blocks), n), dtype=np.int64)
    for latent, block in examples.select("latent", "block").iter_rows():
        counts[np.searchsorted(blocks, block), latent] = 1
    counts[np.searchsorted(blocks, list(FIRED_IN_TWIN)), 0] = 1
    occurrence = OccurrenceWriter(tmp_path, "s", n)
    occurrence.append(blocks, counts)
    occurrence.finish()
    write_tables(tmp_path, "s", planted_features(), examples, {"top_k": 12})
    build_atlas_indexes(tmp_path)
    return tmp_path


def _negatives(atlas, negatives: NegativesSource) -> tuple[dict, list[set[str]], pl.DataFrame]:
    """The eval's result, the planted words in latent 0's non-activating windows, its pool."""
    config = AutointerpConfig(n_latents=len(PLANTED), negatives=negatives, n_similar=1)
    run = run_suite(atlas, ["s"], ["autointerp"], {"autointerp": config}, device="cpu", model=no_model,
                    force=True, progress=False)
    assert not run.failures, run.failures
    tables = FeatureTables(atlas, "s")
    pool = tables.examples if negatives == "random" else SimilarNegatives(atlas, "s", tables.examples, 1).pool(0)
    drawn = latent_examples(0, tables.examples_for(0), pool, n_explain=10, n_activating=10, n_non_activating=10,
                            seed=0).non_activating
    return run.results["s"]["autointerp"], [set(w.tokens) & set(PLANTED) for w in drawn], pool


def test_similar_negatives_come_from_the_nearest_latent_outside_the_latents_blocks(atlas):
    result, words, pool = _negatives(atlas, "similar")
    assert result["eval_config"]["negatives"] == "similar"
    assert len(words) == 10 and all(found == {PLANTED[1]} for found in words)  # latent 1's windows only
    assert set(pool["latent"].to_list()) == {1}
    assert not set(pool["block"].to_list()) & set(FIRED_IN_TWIN)  # blocks where latent 0 fires are left out
    assert pool.height == planted_examples().filter(latent=1).height - len(FIRED_IN_TWIN)
    # a lexical proxy explanation of latent 0 names its word, which the twin's windows lack
    row = next(r for r in result["eval_result_details"] if r["latent"] == 0)
    assert row["detection_balanced_accuracy"] >= 0.95


def test_random_negatives_draw_from_every_other_latent(atlas):
    _, words, _ = _negatives(atlas, "random")
    assert len({next(iter(found)) for found in words}) >= 3


def test_an_unknown_source_of_negatives_is_refused():
    with pytest.raises(InvalidInputError, match="valid: random, similar"):
        autointerp_config("lexical", negatives="faiss")
