"""SAE file formats: the SAELens layout (read and write) and imports from sparsify and
dictionary_learning; `load_any` detects which layout a folder holds."""

from __future__ import annotations

from pathlib import Path

import torch

from saes.formats.dictionary_learning import is_dictionary_learning_folder, load_dictionary_learning
from saes.formats.saelens import CFG_FILE, WEIGHTS_FILE, load_saelens, save_saelens
from saes.formats.sparsify import is_sparsify_folder, load_sparsify
from saes.sae.base import SAE
from store.errors import InvalidInputError

__all__ = ["load_any", "load_dictionary_learning", "load_saelens", "load_sparsify", "save_saelens"]


def load_any(
    folder: str | Path, *, expected_d_in: int | None = None, device: str | torch.device = "cpu"
) -> SAE:
    """Load an SAE folder in whichever supported layout it holds: SAELens
    (`cfg.json` + `sae_weights.safetensors`), sparsify (`cfg.json` + `sae.safetensors`)
    or dictionary_learning (`ae.pt`). InvalidInputError lists the layouts otherwise."""
    path = Path(folder)
    if (path / WEIGHTS_FILE).is_file() or ((path / CFG_FILE).is_file() and not is_sparsify_folder(path)):
        return load_saelens(path, expected_d_in=expected_d_in, device=device)
    if is_sparsify_folder(path):
        return load_sparsify(path, expected_d_in=expected_d_in, device=device)
    if is_dictionary_learning_folder(path):
        return load_dictionary_learning(path, expected_d_in=expected_d_in, device=device)
    present = sorted(p.name for p in path.iterdir())[:20] if path.is_dir() else "(not a directory)"
    raise InvalidInputError(
        f"{path}: no SAE found (contents: {present}); expected SAELens cfg.json + "
        "sae_weights.safetensors, sparsify cfg.json + sae.safetensors, or dictionary_learning ae.pt"
    )
