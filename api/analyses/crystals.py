"""The analysis-run layer of `crystals`; its other layers: `sae_atlas.geometry.crystals` (maths).

Crystals (`analyses/crystals/`): held-out LDA silhouette of the built-in word-pair
relations on a model's embeddings or residual stream, against a random-label null."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from sae_atlas.api.analyses.run_files import encoder_of, run_figure
from sae_atlas.geometry.crystals import (
    CrystalResult,
    crystal_quality,
    difference_vectors,
    relation_pairs,
)
from sae_atlas.geometry.figures import crystals_figure
from sae_atlas.saes.models import ModelHandle
from sae_atlas.store.analysis_runs import write_analysis


@torch.inference_mode()
def word_vectors(handle: ModelHandle, token_ids: np.ndarray, hook: str | None = None) -> np.ndarray:
    """Representations `[N, d]` of single tokens: rows of the input embedding `W_E`, or the
    residual at `hook` on the prompt `[BOS, token]` (last position)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    if hook is None:
        return handle.bridge.W_E.detach().float().numpy()[ids]
    handle.check_hook(hook)
    bos = handle.bos_token_id if handle.bos_token_id is not None else ids[0]
    tokens = torch.stack([torch.full((len(ids),), int(bos)), torch.from_numpy(ids)], 1)
    _, cache = handle.bridge.run_with_cache(tokens, names_filter=lambda name: name == hook)
    return cache[hook][:, -1].float().numpy()


def run_crystals(
    handle: ModelHandle, *, hook: str | None = None, n_null: int = 50, test_frac: float = 0.3, seed: int = 0,
    atlas: str | Path | None = None, run: str | None = None,
) -> tuple[CrystalResult, dict[str, Any]]:
    """Crystal quality of the built-in word-pair relations on a model's embeddings (or the
    residual at `hook`): held-out LDA silhouette against a random-label null."""
    pairs, labels, words = relation_pairs(encoder_of(handle.tokenizer))
    flat = np.unique(pairs)
    X = word_vectors(handle, flat, hook)
    local = np.searchsorted(flat, pairs)
    result = crystal_quality(difference_vectors(X, local), labels, test_frac=test_frac, n_null=n_null, seed=seed)
    params = {"hook": hook, "source": "W_E" if hook is None else hook, "n_pairs": len(pairs),
              "relations": sorted({*labels.tolist()}), "n_null": n_null, "test_frac": test_frac, "seed": seed}
    if atlas is not None:
        run = run or f"crystals-{'embed' if hook is None else re.sub(r'[^A-Za-z0-9._-]', '_', hook)}"
        fig = run_figure(crystals_figure(result, f"crystals ({params['source']})"), atlas, "crystals", run, "silhouette")
        table = pl.DataFrame({"a": [w[0] for w in words], "b": [w[1] for w in words], "relation": labels.tolist()})
        params["json_path"] = str(write_analysis(atlas, "crystals", run, parameters=params, summary=result.summary(),
                                                 tables={"main": table}, extra={"figures": [fig]}))
    return result, params
