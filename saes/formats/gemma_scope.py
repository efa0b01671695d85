"""Import Gemma Scope JumpReLU SAEs: one `params.npz` per folder.

The file holds `W_enc [d_in, d_sae]`, `W_dec [d_sae, d_in]`, `b_enc [d_sae]`,
`b_dec [d_in]` and `threshold [d_sae]` (float32). Gemma Scope encodes
`pre = x @ W_enc + b_enc` (b_dec is not subtracted from the input: our
`apply_b_dec_to_input=False`), `f = pre * (pre > threshold)`, and decodes `f @ W_dec + b_dec`.
The release stores no config: the hook comes from the folder path the way the release
names it (`<repo>-res/layer_12/width_16k/average_l0_82` -> `blocks.12.hook_resid_post`,
`-mlp` -> `hook_mlp_out`, `-att` -> `attn.hook_z`), or is given by the caller. Embedding
SAEs (`embedding/...`) were trained on embeddings scaled by `sqrt(d_model)`; that scale is
folded into the weights (encoder divided, decoder multiplied).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from sae_atlas.errors import IntegrityError
from sae_atlas.saes.formats.assembly import (
    assemble_sae,
    check_d_in,
    make_config,
    reject_unknown,
    take,
)
from sae_atlas.saes.sae.base import SAE

WEIGHTS_FILE = "params.npz"
_REPAIR = "re-download the Gemma Scope params.npz"
_LAYER = re.compile(r"^layer_(\d+)$")


def is_gemma_scope_folder(folder: Path) -> bool:
    """Whether `folder` holds a Gemma Scope `params.npz`."""
    return (folder / WEIGHTS_FILE).is_file()


def gemma_scope_hook(folder: Path) -> str:
    """The TransformerLens hook the release's folder naming implies, or '' if none does."""
    parts = folder.resolve().parts
    layer = next((int(m.group(1)) for part in parts if (m := _LAYER.match(part))), None)
    if "embedding" in parts:
        return "hook_embed"
    if layer is None:
        return ""
    site = next((p for p in reversed(parts) if "gemma-scope" in p), "")
    if site.endswith("-mlp") or "-mlp-" in site:
        return f"blocks.{layer}.hook_mlp_out"
    if site.endswith("-att") or "-att-" in site:
        return f"blocks.{layer}.attn.hook_z"
    return f"blocks.{layer}.hook_resid_post"


def _read_npz(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise IntegrityError(path, "file is missing", _REPAIR)
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: torch.from_numpy(np.array(data[name])) for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise IntegrityError(path, f"not a readable .npz file ({exc})", _REPAIR) from exc


def load_gemma_scope(
    folder: str | Path, *, expected_d_in: int | None = None, device: str | torch.device = "cpu"
) -> SAE:
    """Load a Gemma Scope folder (`params.npz`) as a JumpReLU SAE in eval mode."""
    folder = Path(folder)
    path = folder / WEIGHTS_FILE
    tensors = _read_npz(path)
    reject_unknown(tensors, {"W_enc", "W_dec", "b_enc", "b_dec", "threshold"}, path)
    if "W_enc" not in tensors or tensors["W_enc"].dim() != 2:
        raise IntegrityError(path, f"tensor 'W_enc' [d_in, d_sae] is missing (has: {sorted(tensors)})", _REPAIR)
    d_in, d_sae = tensors["W_enc"].shape
    state = {
        "W_enc": tensors["W_enc"].float(),
        "b_enc": take(tensors, ["b_enc"], (d_sae,), path, _REPAIR).float(),
        "W_dec": take(tensors, ["W_dec"], (d_sae, d_in), path, _REPAIR).float(),
        "b_dec": take(tensors, ["b_dec"], (d_in,), path, _REPAIR).float(),
    }
    threshold = take(tensors, ["threshold"], (d_sae,), path, _REPAIR).float()
    state["log_threshold"] = threshold.clamp_min(0).log()  # <= 0 lets every positive value through
    hook = gemma_scope_hook(folder)
    if hook == "hook_embed":
        state["W_enc"] = state["W_enc"] / d_in**0.5
        state["W_dec"] = state["W_dec"] * d_in**0.5
    cfg = make_config(path, architecture="jumprelu", d_in=int(d_in), d_sae=int(d_sae),
                      apply_b_dec_to_input=False, dtype="float32", hook_name=hook,
                      context_size=1024, dataset_path="monology/pile-uncopyrighted")
    return check_d_in(assemble_sae(cfg, state, path, _REPAIR, device), expected_d_in, path)
