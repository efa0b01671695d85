"""Transcoders spliced into a tiny ReLU-MLP model: exact transcoders (the MLPs' own
weights) at every layer leave the loss unchanged, empty ones equal the zero ablation, and
the atlas evaluation (`core`) of a trained transcoder records the FVU of the MLP output
and the CE loss recovered with its MLP replaced."""

from __future__ import annotations

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.eval.evaluate import evaluate_atlas_sae, read_eval
from sae_atlas.saes.eval.from_model import evaluate_from_model
from sae_atlas.saes.eval.transcoder import replacement_metrics
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.store.activations import ActivationReader
from tests.saes.planted import one_thread  # noqa: F401
from tests.saes.test_transcoder import mlp_transcoder

INS = ["blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in"]
OUTS = ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]


@pytest.fixture(scope="module")
def handle():
    return tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)


@pytest.fixture(scope="module")
def atlas(tmp_path_factory, handle):
    root = tmp_path_factory.mktemp("tc-eval")
    cache_activations(handle, root, [*INS, *OUTS], corpus=CorpusSpec(context_size=16), n_tokens=16 * 160,
                      progress=False)
    return root


def _blocks(atlas, n: int = 4):
    blocks = next(ActivationReader(atlas, INS[0]).blocks("heldout"))
    return [(blocks.token_ids[:n], blocks.is_bos[:n])]


def test_exact_and_empty_transcoders(atlas, handle):
    exact = [mlp_transcoder(handle, layer) for layer in (0, 1)]
    metrics = replacement_metrics(exact, handle.bridge, _blocks(atlas))
    assert metrics["ce_loss_with_sae"] == pytest.approx(metrics["ce_loss_without_sae"], abs=1e-5)
    assert metrics["kl_div_with_sae"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["ce_loss_score"] == pytest.approx(1.0, abs=1e-3)
    empty = [mlp_transcoder(handle, layer) for layer in (0, 1)]
    for sae in empty:
        with torch.no_grad():
            sae.W_dec.zero_()
            sae.b_dec.zero_()
    zeroed = replacement_metrics(empty, handle.bridge, _blocks(atlas))
    assert zeroed["ce_loss_with_sae"] == pytest.approx(zeroed["ce_loss_with_ablation"], abs=1e-5)
    assert abs(zeroed["ce_loss_with_ablation"] - zeroed["ce_loss_without_sae"]) > 1e-3  # the MLPs matter
    # only the second layer exact, the first emptied: the loss moves (the replacement is applied per layer)
    mixed = replacement_metrics([empty[0], exact[1]], handle.bridge, _blocks(atlas))
    assert abs(mixed["ce_loss_with_sae"] - metrics["ce_loss_with_sae"]) > 1e-4
    means = {OUTS[0]: torch.zeros(16), OUTS[1]: torch.zeros(16)}
    as_mean = replacement_metrics(exact, handle.bridge, _blocks(atlas), ablation="mean", means=means)
    assert as_mean["ce_loss_with_ablation"] == pytest.approx(zeroed["ce_loss_with_ablation"], abs=1e-6)
    with pytest.raises(InvalidInputError, match="mean ablation needs"):
        replacement_metrics(exact, handle.bridge, _blocks(atlas), ablation="mean", means={})
    with pytest.raises(InvalidInputError, match="write the same hook"):
        replacement_metrics([exact[0], exact[0]], handle.bridge, _blocks(atlas))


def test_core_eval_of_a_trained_transcoder(atlas, handle):
    record = train_saes(atlas, INS[1:], architecture="topk", d_sae=64, k=16, hook_out={INS[1]: OUTS[1]},
                        train_cfg=TrainConfig(total_tokens=20_000, batch_size=256, progress=False))[INS[1]]
    result = evaluate_atlas_sae(atlas, record["sae_id"], n_tokens=1024, ce_blocks=4, model_handle=handle)
    metrics = result["metrics"]
    assert result["parameters"]["hook_out"] == OUTS[1]
    assert metrics["fvu"] < 0.15 and 0 < metrics["n_tokens"] <= 1024
    assert metrics["ce_loss_score"] > 0.8  # most of the MLP's effect recovered
    assert read_eval(atlas, record["sae_id"])["metrics"]["fvu"] == metrics["fvu"]
    streamed = evaluate_from_model(handle, atlas, [record["sae_id"]], corpus=CorpusSpec(context_size=16, seed=2),
                                   n_tokens=16 * 32)[record["sae_id"]]
    assert streamed["parameters"]["hook_out"] == OUTS[1]
    assert streamed["metrics"]["fvu"] < 0.15  # the output hook streamed beside the input, not the input itself


def test_spliced_transcoder_edits_act_on_the_mlp_output(atlas, handle):
    """Splicing an exact transcoder changes nothing; ablating / steering its feature j moves
    the MLP output by exactly neuron j's write (`-a_j W_out[j]`, `+alpha W_out[j]`)."""
    from sae_atlas.saes.intervene.edits import (
        AblateEdit,
        SteerEdit,
        compile_edit,
        resolve_positions,
    )
    from sae_atlas.saes.intervene.splice import Splice, run_spliced

    sae = mlp_transcoder(handle, 1)
    tokens = handle.to_tokens("the cat sat on the mat and the dog ran")[0]
    clean = handle.bridge(tokens[None])[0].detach()
    spliced = run_spliced(handle, tokens, Splice({"tc": (INS[1], sae)}))
    torch.testing.assert_close(spliced.logits_TV, clean, atol=1e-4, rtol=1e-4)
    _, cache = handle.bridge.run_with_cache(tokens[None], names_filter=[INS[1]])
    acts = sae.encode(cache[INS[1]][0]).detach()
    j = int(acts[-1].argmax())
    last = resolve_positions("last", [], len(tokens), len(tokens))
    W_out = sae.W_dec.detach()[j]
    for spec, delta in ((AblateEdit(sae="tc", feature=j, at="last"), -float(acts[-1, j]) * W_out),
                        (SteerEdit(sae="tc", feature=j, alpha=3.0, at="last"), 3.0 * W_out)):
        edit = compile_edit(spec, last, sae=sae, hook=OUTS[1])
        got = run_spliced(handle, tokens, Splice({"tc": (INS[1], sae)}, [edit])).logits_TV

        def shift(act, hook=None, delta=delta):
            act = act.clone()
            act[:, -1] += delta
            return act

        want = handle.bridge.run_with_hooks(tokens[None], fwd_hooks=[(OUTS[1], shift)])[0].detach()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert float((want[-1] - clean[-1]).abs().max()) > 1e-3, spec.kind
