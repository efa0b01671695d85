"""Planted single-token latents for the autointerp tests: latent k fires on word k only."""

from __future__ import annotations

import numpy as np
import polars as pl

from sae_atlas.store.tables import EXAMPLES_SCHEMA, FEATURES_SCHEMA

PLANTED = [" apple", " river", " violin", " copper", " falcon", " tulip"]
FILLER = [" the", " a", " of", " and", " to", " in", " it", " was", " on", " with", " for", " at", " by",
          " from", " that", " this", " we", " they", " some", " more"]
WIDTH = 9


def planted_examples(*, n_top: int = 12, n_bands: int = 3, per_band: int = 4, seed: int = 0) -> pl.DataFrame:
    """Summary example rows (top, then bands) of every planted latent: windows of filler
    words with the latent's word at a random position, where alone it fires."""
    rng = np.random.default_rng(seed)
    rows = []
    for latent, word in enumerate(PLANTED):
        kinds = [("top", None, rank) for rank in range(n_top)]
        kinds += [("band", band, rank) for band in range(n_bands) for rank in range(per_band)]
        for i, (kind, band, rank) in enumerate(kinds):
            tokens = [FILLER[j] for j in rng.integers(len(FILLER), size=WIDTH)]
            centre = int(rng.integers(WIDTH))
            tokens[centre] = word
            act = 10.0 - rank * 0.1 if kind == "top" else 1.0 + (band or 0)
            acts = [act if j == centre else 0.0 for j in range(WIDTH)]
            rows.append({"latent": latent, "kind": kind, "band": band, "band_lo": None if band is None else act - 0.5,
                         "band_hi": None if band is None else act + 0.5, "rank": rank, "act": act, "token_id": latent,
                         "block": latent * 1000 + i, "pos": centre, "doc_id": latent, "centre": centre,
                         "token_ids": [0] * WIDTH, "acts": acts, "tokens": tokens})
    return pl.DataFrame(rows, schema=EXAMPLES_SCHEMA)


def planted_features() -> pl.DataFrame:
    """One features row per planted latent (all alive)."""
    n = len(PLANTED)
    return pl.DataFrame({
        "latent": range(n), "n_active": [100] * n, "density": [0.01] * n, "mean_act": [0.1] * n,
        "mean_active_act": [5.0] * n, "max_act": [10.0] * n, "quantiles": [[1.0, 5.0, 9.0]] * n,
        "hist_top": [16.0] * n, "hist_counts": [[0, 1]] * n, "decoder_norm": [1.0] * n,
        "top_logit_ids": [[1]] * n, "top_logit_values": [[1.0]] * n, "top_logit_tokens": [[" pie"]] * n,
        "bottom_logit_ids": [[2]] * n, "bottom_logit_values": [[-1.0]] * n, "bottom_logit_tokens": [[" x"]] * n,
    }, schema=FEATURES_SCHEMA)
