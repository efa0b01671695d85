"""SAE file formats: the SAELens layout (read and write) and imports from Gemma Scope,
Llama Scope, sparsify, dictionary_learning and circuit-tracer (a layer file of a transcoder
set); `detect_layout` names the layout a folder (or layer file) holds and `load_any` loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.formats.assembly import read_config
from sae_atlas.saes.formats.circuit_tracer import is_circuit_tracer_file, load_circuit_tracer
from sae_atlas.saes.formats.dictionary_learning import (
    is_dictionary_learning_folder,
    load_dictionary_learning,
)
from sae_atlas.saes.formats.gemma_scope import is_gemma_scope_folder, load_gemma_scope
from sae_atlas.saes.formats.llama_scope import is_llama_scope_folder, load_llama_scope
from sae_atlas.saes.formats.saelens import (
    CFG_FILE,
    WEIGHTS_FILE,
    load_saelens,
    normalization,
    save_saelens,
)
from sae_atlas.saes.formats.sparsify import is_sparsify_folder, load_sparsify
from sae_atlas.saes.sae.base import SAE

__all__ = ["Layout", "declared_normalization", "detect_layout", "load_any", "load_circuit_tracer",
           "load_dictionary_learning",
           "load_gemma_scope", "load_llama_scope", "load_saelens", "load_sparsify", "save_saelens"]

Layout = Literal["saelens", "sparsify", "gemma_scope", "llama_scope", "dictionary_learning", "circuit_tracer"]
_LOADERS = {"sparsify": load_sparsify, "gemma_scope": load_gemma_scope,
            "llama_scope": load_llama_scope, "dictionary_learning": load_dictionary_learning,
            "circuit_tracer": load_circuit_tracer}


def detect_layout(folder: str | Path) -> Layout:
    """The layout `folder` holds; InvalidInputError listing the known layouts otherwise."""
    path = Path(folder)
    if is_circuit_tracer_file(path):
        return "circuit_tracer"
    if (path / WEIGHTS_FILE).is_file() or ((path / CFG_FILE).is_file() and not is_sparsify_folder(path)):
        return "saelens"
    checks: list[tuple[Layout, bool]] = [
        ("sparsify", is_sparsify_folder(path)), ("gemma_scope", is_gemma_scope_folder(path)),
        ("llama_scope", is_llama_scope_folder(path)), ("dictionary_learning", is_dictionary_learning_folder(path)),
    ]
    for layout, found in checks:
        if found:
            return layout
    present = sorted(p.name for p in path.iterdir())[:20] if path.is_dir() else "(not a directory)"
    raise InvalidInputError(
        f"{path}: no SAE found (contents: {present}); expected SAELens cfg.json + "
        "sae_weights.safetensors, sparsify cfg.json + sae.safetensors, Gemma Scope params.npz, "
        "Llama Scope hyperparams.json + checkpoints/final.safetensors, dictionary_learning ae.pt, or a "
        "circuit-tracer layer file (layer_<i>.safetensors beside its config.yaml)"
    )


def declared_normalization(folder: str | Path) -> str:
    """The run-time input normalisation a folder's config asks for that its reader cannot
    fold by itself ('expected_average_only_in' needs a scale from outside; else 'none')."""
    path = Path(folder)
    if detect_layout(path) != "saelens":
        return "none"
    return normalization(read_config(path / CFG_FILE, "re-download or re-export the SAE folder"))


def load_any(
    folder: str | Path,
    *,
    expected_d_in: int | None = None,
    device: str | torch.device = "cpu",
    norm_scaling_factor: float | None = None,
) -> SAE:
    """Load an SAE folder in whichever supported layout it holds (see `detect_layout`);
    `norm_scaling_factor` is folded into SAELens SAEs that ask for input normalisation."""
    path = Path(folder)
    layout = detect_layout(path)
    if layout == "saelens":
        return load_saelens(path, expected_d_in=expected_d_in, device=device,
                            norm_scaling_factor=norm_scaling_factor)
    return _LOADERS[layout](path, expected_d_in=expected_d_in, device=device)
