"""A small but complete atlas for the API tests and the HTTP benchmark.

Tiny random Llama (2 layers, d_model 32), ~200 cached blocks of 32 builtin-corpus tokens
at both residual streams, one short TopK SAE per hook, feature summaries, and whatever
indexes / maps / analyses the installed helpers can build. One planted analysis (a table,
its parameters and a PNG figure) lets the geometry endpoints be tested independently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.store.atomic import atomic_path
from sae_atlas.store.layout import AtlasLayout

HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
CONTEXT = 32
N_BLOCKS = 200
D_SAE = 64
PLANTED_KIND = "planted"
PLANTED_RUN = "demo-run"


def _planted_analysis(root: Path) -> None:
    """A result in the analyses layout through `store.analysis_runs.write_analysis`: the PNG
    `<run>.png`, then `<run>.parquet`, `<run>.json` and the kind's `runs.json`."""
    from sae_atlas.store.analysis_runs import write_analysis

    folder = AtlasLayout(root).analysis_dir(PLANTED_KIND)
    folder.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot(np.cos(np.linspace(0, 6.3, 50)), np.sin(np.linspace(0, 6.3, 50)))
    with atomic_path(folder / f"{PLANTED_RUN}.png") as tmp:
        fig.savefig(tmp, format="png", dpi=50)
    plt.close(fig)
    frame = pl.DataFrame({"cluster": [0, 1], "size": [3, 2], "score": [0.9, 0.4]})
    write_analysis(root, PLANTED_KIND, PLANTED_RUN, parameters={"seed": 0}, summary={"n_clusters": 2},
                   tables={"main": frame}, extra={"figures": [f"{PLANTED_RUN}.png"]})


def build_small_atlas(root: str | Path) -> dict[str, Any]:
    """Build the small atlas at `root`; returns facts the tests check against."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import tiny_model
    from sae_atlas.saes.summary.run import summarize_sae
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.train_saes import train_saes
    from sae_atlas.store.index import build_atlas_indexes

    root = Path(root)
    handle = tiny_model(n_layers=2, d_model=32)
    cache_activations(handle, root, HOOKS, corpus=CorpusSpec(context_size=CONTEXT),
                      n_tokens=N_BLOCKS * CONTEXT, progress=False)
    trained = train_saes(root, HOOKS, architecture="topk", d_sae=D_SAE, k=4,
                         train_cfg=TrainConfig(total_tokens=256 * 20, batch_size=256, progress=False))
    sae_ids = [trained[h]["sae_id"] for h in HOOKS]
    for sae_id in sae_ids:
        summarize_sae(root, sae_id, W_U=handle.W_U.detach(), final_norm_weight=handle.final_norm_weight,
                      norm_kind=handle.final_norm_kind, tokenizer=handle.tokenizer, top_k=8,
                      window=(6, 2), progress=False)
    Atlas(root).build_labels(sae_ids)  # as `sae-atlas summarize` does
    build_atlas_indexes(root)
    for sae_id in sae_ids:
        write_planted_map(root, sae_id)
    _planted_analysis(root)
    return {"root": root, "sae_ids": sae_ids, "hooks": HOOKS, "d_sae": D_SAE, "d_in": 32}


def write_planted_map(root: str | Path, sae_id: str) -> pl.DataFrame:
    """A map in both bases from principal directions (UMAP is too slow to JIT in a test
    fixture): decoder (latent, x, y, knn_overlap) from the SAE's decoder rows, co-occurrence
    (cooc_x, cooc_y, cooc_knn_overlap) from its occurrence matrix, a `cluster` label, with
    the overlap scores measured; written with `store.maps.write_map`."""
    from sae_atlas.geometry.lobes import cooccurrence_knn
    from sae_atlas.geometry.maps import (
        FeatureMap,
        cooccurrence_neighbours,
        decoder_neighbours,
        kept_neighbours,
    )
    from sae_atlas.saes.formats import load_any
    from sae_atlas.store.maps import map_frame, stored_summary, write_map
    from sae_atlas.store.tables import load_occurrence

    W = load_any(AtlasLayout(root).require_sae(sae_id)).W_dec.detach().numpy()
    occ = load_occurrence(root, sae_id)[0]
    dec_nbrs, cooc_nbrs = decoder_neighbours(W, 10), cooccurrence_neighbours(cooccurrence_knn(occ, k=10), 10)
    maps = {}
    for basis, X, own, other in (("decoder", W, dec_nbrs, cooc_nbrs),
                                 ("cooccurrence", (occ != 0).T.toarray().astype(np.float32), cooc_nbrs, dec_nbrs)):
        X = X - X.mean(0)
        xy = (X @ np.linalg.svd(X, full_matrices=False)[2][:2].T).astype(np.float32)
        maps[basis] = FeatureMap(xy, kept_neighbours(own, xy), {"method": "pca-planted", "k_overlap": 10},
                                 kept_neighbours(other, xy))
    frame = map_frame(maps["decoder"], {"cluster": np.arange(len(W)) % 4}, cooccurrence=maps["cooccurrence"])
    write_map(root, sae_id, frame, *stored_summary(maps))
    return frame
