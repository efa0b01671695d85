"""Folders written by the real dictionary_learning and sparsify libraries
(tests/fixtures/make_library_written.py) load to the codes and reconstructions the
libraries themselves computed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sae_atlas.saes.formats import detect_layout, load_any

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "library_written"
FOLDERS = {"dictionary_learning_batchtopk": ("dictionary_learning", "batchtopk"),
           "dictionary_learning_topk": ("dictionary_learning", "topk"),
           "sparsify": ("sparsify", "topk")}


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_library_written_folder_matches_the_library(name: str) -> None:
    io = load_file(str(HERE / "io.safetensors"))
    folder = HERE / name / "layers.1" if name == "sparsify" else HERE / name
    layout, architecture = FOLDERS[name]
    assert detect_layout(folder) == layout
    sae = load_any(folder)
    assert sae.cfg.architecture == architecture and sae.cfg.hook_name == "blocks.1.hook_resid_post"
    out = sae(io["x"])
    assert (io[f"{name}.f"] != 0).any()
    torch.testing.assert_close(out.feature_acts, io[f"{name}.f"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.x_hat, io[f"{name}.x_hat"], atol=1e-5, rtol=1e-5)
    if architecture == "batchtopk":  # the learned threshold survives the import, and matters here
        assert torch.all(sae.threshold == 0.4) and (out.pre_acts.relu() != out.feature_acts).any()
