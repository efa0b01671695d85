"""Feature summaries on a synthetic cache with planted activations, checked against brute force.

The SAE here is the identity with a ReLU (W_enc = W_dec = I), so the feature activations
are exactly the (planted) cached values and every statistic can be recomputed directly.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
import typer
from typer.testing import CliRunner

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.sae.standard import StandardSAE
from sae_atlas.saes.summary.accumulator import SummaryParams
from sae_atlas.saes.summary.bands import latent_salts, token_keys
from sae_atlas.saes.summary.logits import logit_directions, logit_effects, vocab_strings
from sae_atlas.saes.summary.run import summarize_blocks, summarize_sae
from sae_atlas.store.activations import ActivationReader, ActivationWriter, Blocks
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.tables import FeatureTables, histogram_edges, load_occurrence

HOOK = "blocks.1.hook_resid_post"
F, T, N_BLOCKS = 12, 32, 100
PLANTED_TOKEN = 7  # latent 0 fires strongly exactly on this token


class ReluIdentity(StandardSAE):
    """f = relu(x): an SAE whose activations are its inputs' positive parts."""

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return pre.relu()


def identity_sae(d: int = F) -> SAE:
    sae = ReluIdentity(SAEConfig(architecture="standard", d_in=d, d_sae=d, hook_name=HOOK))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(d))
        sae.W_dec.copy_(torch.eye(d) * torch.linspace(1, 2, d)[:, None])
    return sae.eval()


def planted_cache(root, *, d: int = F, n_blocks: int = N_BLOCKS, vocab: int = 40, seed: int = 0) -> None:
    """Sparse positive activations whose scale grows along the stream (so histogram scales
    shift), huge values at BOS (which must be ignored), and latent 0 tied to one token."""
    gen = torch.Generator().manual_seed(seed)
    writer = ActivationWriter(root, HOOK, d=d, context_size=T, bos_token_id=1, shard_blocks=16)
    for start in range(0, n_blocks, 10):
        n = min(10, n_blocks - start)
        toks = torch.randint(3, vocab, (n, T), generator=gen)
        toks[:, 0] = 1
        growth = (1 + torch.arange(start, start + n).float() / 10)[:, None, None] ** 2
        acts = torch.rand(n, T, d, generator=gen) * 2 - 0.6
        acts = acts * torch.exp(torch.randn(n, T, d, generator=gen)) * growth
        acts[..., 0] = torch.where(toks == PLANTED_TOKEN, 50 + torch.rand(n, T, generator=gen), -1.0)
        acts[:, 0, :] = 1e6  # BOS
        writer.append(acts, toks, torch.arange(start, start + n))
    writer.finish()


def heldout_arrays(root) -> dict[str, np.ndarray]:
    """Brute-force view of the held-out split: f [n, T, F] with BOS zeroed, tokens, blocks."""
    parts = list(ActivationReader(root, HOOK).blocks("heldout"))
    acts = torch.cat([p.acts for p in parts]).relu()
    bos = torch.cat([p.is_bos for p in parts])
    acts[bos] = 0
    return {
        "f": acts.numpy(),
        "tokens": torch.cat([p.token_ids for p in parts]).numpy(),
        "block": torch.cat([p.block_index for p in parts]).numpy(),
    }


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas")
    planted_cache(root)
    save_saelens(identity_sae(), AtlasLayout(root).sae_dir("relu-id"))
    W_U = torch.randn(F, 30, generator=torch.Generator().manual_seed(1))
    report = summarize_sae(root, "relu-id", sae=identity_sae(), W_U=W_U, n_bands=4, per_band=3,
                           window=(5, 2), top_k=8, batch_tokens=T, progress=False)
    return root, report, W_U


def test_top_examples_are_exactly_the_highest_activations_in_order(atlas):
    root, report, _ = atlas
    a = heldout_arrays(root)
    f, n_blk = a["f"], a["f"].shape[0]
    assert report.n_tokens == n_blk * (T - 1)  # BOS excluded
    tables = FeatureTables(root, "relu-id")
    flat = f.reshape(-1, F)
    for latent in range(F):
        top = tables.examples_for(latent, "top")
        order = np.argsort(-flat[:, latent], kind="stable")[:8]
        order = order[flat[order, latent] > 0]
        assert top["rank"].to_list() == list(range(len(order)))
        assert np.array_equal(top["act"].to_numpy(), flat[order, latent])
        assert np.array_equal(top["block"].to_numpy(), a["block"][order // T])
        assert np.array_equal(top["pos"].to_numpy(), order % T)
        for row in top.iter_rows(named=True):
            b, p = row["block"] - a["block"][0], row["pos"]
            lo, hi = max(0, p - 5), min(T, p + 3)
            assert row["token_ids"] == a["tokens"][b, lo:hi].tolist()
            assert np.allclose(row["acts"], f[b, lo:hi, latent])
            assert row["centre"] == p - lo and row["token_id"] == a["tokens"][b, p]
            assert row["acts"][row["centre"]] == row["act"]


def test_statistics_histogram_and_quantiles(atlas):
    root, _, _ = atlas
    f = heldout_arrays(root)["f"]
    valid = np.ones(f.shape[:2], bool)
    valid[:, 0] = False
    flat = f[valid]
    tables = FeatureTables(root, "relu-id")
    params = tables.params
    bpo, n_bins = params["bins_per_octave"], params["bins_per_octave"] * params["n_octaves"]
    feats = tables.features
    assert np.array_equal(feats["n_active"].to_numpy(), (flat > 0).sum(0))
    assert np.allclose(feats["density"].to_numpy(), (flat > 0).mean(0))
    assert np.allclose(feats["mean_act"].to_numpy(), flat.mean(0), rtol=1e-5)
    assert np.array_equal(feats["max_act"].to_numpy(), flat.max(0))
    assert feats["max_act"].max() < 1e6  # BOS ignored
    ratio = 2 ** (1 / bpo)
    for latent in range(F):
        row = tables.feature(latent)
        values = np.sort(flat[flat[:, latent] > 0, latent])
        assert row["hist_top"] > values[-1] >= row["hist_top"] / 2
        edges = histogram_edges(row["hist_top"], n_bins, bpo)
        expected = np.bincount(np.searchsorted(edges, values, side="right"), minlength=n_bins + 1)
        assert row["hist_counts"] == expected.tolist()
        n = len(values)
        for q, got in zip(params["quantile_levels"], row["quantiles"], strict=True):
            lo = values[max(int(np.floor(q * n)) - 1, 0)]
            hi = values[min(int(np.ceil(q * n)), n - 1)]
            assert lo / ratio <= got <= hi * ratio * 1.0001, (latent, q)


def test_band_samples_equal_brute_force_priority_sampling(atlas):
    root, _, _ = atlas
    a = heldout_arrays(root)
    tables = FeatureTables(root, "relu-id")
    bpo, seed = tables.params["bins_per_octave"], tables.params["seed"]
    f = torch.from_numpy(a["f"])
    gid = (torch.from_numpy(a["block"])[:, None] * T + torch.arange(T)).reshape(-1)
    flat = f.reshape(-1, F)
    for latent in range(F):
        active = (flat[:, latent] > 0).nonzero(as_tuple=True)[0]
        v = flat[active, latent]
        octave = torch.div(torch.floor(torch.log2(v) * bpo).long(), bpo, rounding_mode="floor")
        exponent = int(octave.max()) + 1
        band = exponent - octave - 1
        keys = token_keys(gid[active], latent_salts(torch.full_like(active, latent), seed))
        rows = tables.examples_for(latent, "band")
        for b in range(4):
            members = (band == b).nonzero(as_tuple=True)[0]
            chosen = members[torch.argsort(keys[members], stable=True)[:3]]
            expected = sorted(gid[active[chosen]].tolist())
            got_rows = rows.filter(pl.col("band") == b)
            got = sorted((got_rows["block"] * T + got_rows["pos"]).to_list())
            assert got == expected, (latent, b)
            assert (got_rows["act"] >= got_rows["band_lo"]).all() and (got_rows["act"] < got_rows["band_hi"]).all()
            assert got_rows["rank"].to_list() == list(range(len(got)))
            assert got_rows["act"].is_sorted(descending=True)


def test_results_do_not_depend_on_batch_size(atlas):
    root, _, _ = atlas
    sae = identity_sae()
    params = SummaryParams(top_k=5, n_bands=3, per_band=2, window_before=3, window_after=1)
    reader = ActivationReader(root, HOOK)
    small = summarize_blocks(sae, reader.blocks("heldout"), params, batch_tokens=T)
    large = summarize_blocks(sae, reader.blocks("heldout"), params, batch_tokens=64 * T)
    assert torch.equal(small.stats.counts, large.stats.counts)
    assert torch.equal(small.scale.exponent, large.scale.exponent)
    norms = torch.ones(F)
    assert small.features_frame(norms, None, None).equals(large.features_frame(norms, None, None))
    assert small.examples_frame(None).equals(large.examples_frame(None))


def test_features_for_a_token_and_occurrence(atlas):
    root, _, W_U = atlas
    tables = FeatureTables(root, "relu-id")
    centred = tables.latents_centred_on(PLANTED_TOKEN)
    planted = tables.examples_for(0, "top")["token_id"].to_list()
    assert len(planted) >= 3 and planted == [PLANTED_TOKEN] * len(planted)
    assert centred["latent"][0] == 0 and centred["n_examples"][0] == len(planted)
    sae = identity_sae()
    for token in (0, 5, 29):
        effect = (sae.W_dec @ W_U[:, token]).detach()
        stored = tables.latents_promoting(token, limit=F)  # latents with the token in their top 10
        assert np.allclose(stored["logit"].to_numpy(), effect[stored["latent"].to_numpy()].numpy())
        assert stored["logit"].is_sorted(descending=True)
    a = heldout_arrays(root)
    matrix, blocks = load_occurrence(root, "relu-id")
    assert np.array_equal(blocks, a["block"])
    assert np.array_equal(matrix.toarray(), (a["f"] > 0).sum(1))


def test_logit_effect_norm_conventions():
    gen = torch.Generator().manual_seed(0)
    W_dec, W_U, w = torch.randn(6, 8, generator=gen), torch.randn(8, 20, generator=gen), torch.rand(8, generator=gen) + 0.5
    rms = logit_effects(W_dec, W_U, final_norm_weight=w, norm_kind="rms", n=3)
    full = (W_dec * w) @ W_U
    assert torch.equal(rms.top_ids, full.topk(3, dim=1).indices)
    assert torch.allclose(rms.bottom_values, full.topk(3, dim=1, largest=False).values)
    centred = (W_dec - W_dec.mean(1, keepdim=True)) * w
    assert torch.allclose(logit_directions(W_dec, w, "layer"), centred)
    layer = logit_effects(W_dec, W_U, final_norm_weight=w, norm_kind="layer", n=3, chunk=4)
    assert torch.equal(layer.top_ids, (centred @ W_U).topk(3, dim=1).indices)
    assert torch.equal(logit_directions(W_dec, w, "none"), W_dec)
    with pytest.raises(InvalidInputError, match="rms, layer, none"):
        logit_directions(W_dec, w, "batch")
    with pytest.raises(InvalidInputError, match="d_in=8"):
        logit_effects(W_dec, W_U.T)


class _CountingTokenizer:
    """Decodes id i as "t<i>" and counts how often a whole vocabulary is decoded."""

    def __init__(self, size: int) -> None:
        self.size, self.decodes = size, 0

    def __len__(self) -> int:
        return self.size

    def batch_decode(self, ids: list[list[int]]) -> list[str]:
        self.decodes += 1
        return [f"t{row[0]}" for row in ids]


def test_vocabulary_is_decoded_once_per_tokenizer_and_size():
    first, second = _CountingTokenizer(5), _CountingTokenizer(5)
    assert vocab_strings(first, 7) == ("t0", "t1", "t2", "t3", "t4", "", "")
    assert vocab_strings(first, 7) is vocab_strings(first, 7)
    assert first.decodes == 1
    assert vocab_strings(first, 3) == ("t0", "t1", "t2") and first.decodes == 2
    assert vocab_strings(second, 7) == vocab_strings(first, 7) and second.decodes == 1


def _synthetic_blocks(n_blocks: int, d: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, n_blocks, 8):
        acts = torch.randn(8, T, d, generator=gen)
        toks = torch.randint(3, 50, (8, T), generator=gen)
        bos = torch.zeros(8, T, dtype=torch.bool)
        bos[:, 0] = True
        yield Blocks(acts, toks, torch.arange(T).expand(8, T), torch.zeros(8, T, dtype=torch.long),
                     torch.arange(start, start + 8), bos)


def test_memory_is_bounded_as_tokens_grow():
    """Structural bound: every accumulator is a fixed-size table, the same after N and 2N
    tokens, and the occurrence matrix goes to a disk spool rather than memory."""
    d = 64
    params = SummaryParams(top_k=10, n_bands=4, per_band=3)
    sizes = {}
    for n_blocks in (16, 32):
        acc = summarize_blocks(identity_sae(d), _synthetic_blocks(n_blocks, d), params, batch_tokens=4 * T)
        assert acc.n_tokens == n_blocks * (T - 1)
        assert len(acc.top.entries()["latent"]) == d * params.top_k
        sizes[n_blocks] = (acc.stats.state_nbytes(), acc.top.state_nbytes(), acc.bands.state_nbytes(),
                           acc.state_nbytes())
    assert sizes[16] == sizes[32]
    width = params.window_before + params.window_after + 1
    per_slot = 8 + 3 * 8 + 4 + width * (4 + 4)  # score, block/pos/doc, value, window acts + tokens
    slots = d * (params.top_k + params.n_bands * params.per_band)
    hist = d * (params.n_octaves * params.bins_per_octave + 1) * 8
    assert sizes[32][3] <= slots * per_slot + hist + d * 64


def test_token_cap_resume_skip_and_errors(tmp_path):
    planted_cache(tmp_path, n_blocks=40)
    save_saelens(identity_sae(), AtlasLayout(tmp_path).sae_dir("s"))
    sae = identity_sae()
    first = summarize_sae(tmp_path, "s", sae=sae, n_tokens=40, progress=False)
    assert first.n_tokens == 2 * (T - 1) and not first.skipped  # rounded up to whole blocks
    assert FeatureTables(tmp_path, "s").features["top_logit_ids"].null_count() == F  # no W_U
    again = summarize_sae(tmp_path, "s", sae=sae, n_tokens=40, progress=False)
    assert again.skipped and again.n_tokens == first.n_tokens
    assert not summarize_sae(tmp_path, "s", sae=sae, n_tokens=40, progress=False, force=True).skipped
    assert not summarize_sae(tmp_path, "s", sae=sae, n_tokens=50, progress=False).skipped
    with pytest.raises(InvalidInputError, match="d_in=5"):
        summarize_sae(tmp_path, "s", sae=identity_sae(5), progress=False)
    with pytest.raises(InvalidInputError, match="top_k"):
        summarize_sae(tmp_path, "s", sae=sae, top_k=0, progress=False)


def test_cli_summarizes_a_saved_sae_with_the_atlas_model(tmp_path):
    from sae_atlas.api.commands.summarize import register
    from sae_atlas.saes.formats.saelens import save_saelens
    from sae_atlas.saes.models import load_model

    handle = load_model({"kind": "tiny"})  # the CLI's load_model returns this same handle
    AtlasLayout(tmp_path).update_meta(model=handle.spec)
    d = handle.d_model
    planted_cache(tmp_path, d=d, n_blocks=20, vocab=handle.d_vocab)
    sae = identity_sae(d)
    save_saelens(sae, AtlasLayout(tmp_path).sae_dir("tiny-l1"))
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    result = CliRunner().invoke(app, ["summarize", str(tmp_path), "--top-k", "4", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)[0]
    assert report["sae_id"] == "tiny-l1" and report["logit_effects"] and report["n_latents"] == d
    tables = FeatureTables(tmp_path, "tiny-l1")
    row = tables.feature(3)
    w = handle.final_norm_weight
    expected = ((sae.W_dec[3] * w) @ handle.W_U).topk(10)
    assert row["top_logit_ids"] == expected.indices.tolist()
    assert row["top_logit_tokens"][0] == handle.tokenizer.decode([row["top_logit_ids"][0]])
    example = tables.examples_for(3, "top").row(0, named=True)
    assert example["tokens"] == [handle.tokenizer.decode([t]) for t in example["token_ids"]]
    bad = CliRunner().invoke(app, ["summarize", str(tmp_path), "--sae", "missing"])
    assert bad.exit_code == 2 and "tiny-l1" in bad.output
