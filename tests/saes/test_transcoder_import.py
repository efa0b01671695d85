"""Importing transcoders: folders written by SAELens, circuit-tracer and sparsify
(tests/fixtures/make_transcoder_written.py) load to the codes and outputs the libraries
computed; a circuit-tracer layer file goes through the import pipeline and its misload
guard (an exact transcoder of a tiny ReLU MLP is accepted and registered with both hooks,
one whose config names the wrong output hook is refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats import detect_layout, load_any
from sae_atlas.saes.importing.pipeline import MisloadError, import_sae
from sae_atlas.saes.models import tiny_model
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread  # noqa: F401

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "transcoder_written"
HOOK_IN, HOOK_OUT = "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"
FIXTURES = {  # name: (path, layout, architecture, skip)
    "saelens_transcoder": ("saelens_transcoder", "saelens", "standard", False),
    "saelens_skip_transcoder": ("saelens_skip_transcoder", "saelens", "standard", True),
    "saelens_jumprelu_transcoder": ("saelens_jumprelu_transcoder", "saelens", "jumprelu", False),
    "circuit_tracer_0": ("circuit_tracer/layer_0.safetensors", "circuit_tracer", "standard", False),
    "circuit_tracer_1": ("circuit_tracer/layer_1.safetensors", "circuit_tracer", "standard", True),
    "circuit_tracer_2": ("circuit_tracer/layer_2.safetensors", "circuit_tracer", "jumprelu", True),
    "sparsify": ("sparsify/layers.1.mlp", "sparsify", "topk", True),
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_library_written_transcoders_match_the_library(name: str) -> None:
    io = load_file(str(HERE / "io.safetensors"))
    path, layout, architecture, skip = FIXTURES[name]
    assert detect_layout(HERE / path) == layout
    sae = load_any(HERE / path)
    assert sae.is_transcoder and sae.cfg.architecture == architecture and sae.cfg.skip == skip
    assert not sae.cfg.apply_b_dec_to_input
    if name.startswith("circuit_tracer"):
        layer = int(name[-1])
        assert (sae.cfg.hook_name, sae.cfg.hook_name_out) == (f"blocks.{layer}.ln2.hook_normalized",
                                                              f"blocks.{layer}.hook_mlp_out")
    elif name == "sparsify":  # the MLP module's input and output
        assert (sae.cfg.hook_name, sae.cfg.hook_name_out) == ("blocks.1.mlp.hook_in", HOOK_OUT)
    else:
        assert (sae.cfg.hook_name, sae.cfg.hook_name_out) == (HOOK_IN, HOOK_OUT)
    out = sae(io["x"])
    assert (io[f"{name}.f"] != 0).any() and (io[f"{name}.f"] == 0).any()
    torch.testing.assert_close(out.feature_acts, io[f"{name}.f"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.x_hat, io[f"{name}.out"], atol=1e-6, rtol=1e-6)


def _exact_set(folder: Path, handle, output_hook: str = "hook_mlp_out") -> Path:
    """A circuit-tracer transcoder set whose layer 1 is the tiny model's own ReLU MLP."""
    folder.mkdir(parents=True)
    mlp = handle.bridge.blocks[1].mlp
    save_file({"W_enc": mlp.W_in.detach().T.contiguous(), "b_enc": mlp.b_in.detach().clone(),
               "W_dec": mlp.W_out.detach().contiguous(), "b_dec": mlp.b_out.detach().clone()},
              folder / "layer_1.safetensors")
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "transcoder_set", "model_name": "tiny", "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": output_hook}))
    return folder / "layer_1.safetensors"


def test_circuit_tracer_import_through_the_guard(tmp_path: Path) -> None:
    handle = tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)
    root = tmp_path / "atlas"
    cache_activations(handle, root, ["blocks.1.mlp.hook_in", HOOK_OUT, "blocks.1.hook_attn_out"],
                      corpus=CorpusSpec(context_size=16), n_tokens=16 * 120, progress=False)
    result = import_sae(root, _exact_set(tmp_path / "set", handle), model_handle=handle, ce_blocks=2)
    assert not result.suspect and result.metrics["fvu"] < 1e-6
    assert result.metrics["ce_loss_score"] == pytest.approx(1.0, abs=1e-3)
    record = AtlasLayout(root).read_meta()["saes"][result.sae_id]
    assert (record["hook"], record["hook_out"], record["source"]["format"]) == (
        "blocks.1.mlp.hook_in", HOOK_OUT, "circuit_tracer")
    source = json.loads((AtlasLayout(root).sae_dir(result.sae_id) / "source.json").read_text())
    assert "layer_1.safetensors" in source["original_files"]
    # the config names the attention output: the MLP's weights cannot predict it -> refused
    wrong = _exact_set(tmp_path / "wrong", handle, output_hook="hook_attn_out")
    with pytest.raises(MisloadError, match="fvu"):
        import_sae(root, wrong, model_handle=handle, with_model=False)
    with pytest.raises(InvalidInputError, match="is a file"):
        import_sae(root, tmp_path / "set" / "config.yaml", model_handle=handle)
