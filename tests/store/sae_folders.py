"""Minimal SAELens-layout folders with a given decoder, for index and search tests."""

import json

import torch
from safetensors.torch import save_file


def write_sae(root, sae_id, W_dec, hook):
    """Write `saes/<sae_id>/` with zero encoder weights and decoder `W_dec [d_sae, d_in]`;
    returns the folder."""
    folder = root / "saes" / sae_id
    folder.mkdir(parents=True, exist_ok=True)
    d_sae, d_in = W_dec.shape
    save_file({"W_enc": torch.zeros(d_in, d_sae), "b_enc": torch.zeros(d_sae),
               "W_dec": torch.as_tensor(W_dec, dtype=torch.float32).contiguous(), "b_dec": torch.zeros(d_in)},
              str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"d_in": d_in, "d_sae": d_sae, "architecture": "standard",
                                                 "metadata": {"hook_name": hook}}))
    return folder
