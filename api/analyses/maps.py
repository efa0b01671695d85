"""Feature maps: the UMAP map of an SAE's decoder rows (`saes/<id>/map.parquet` + `map.png`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from geometry.canvas import save_png
from geometry.figures import map_figure
from geometry.maps import feature_map, map_frame, read_map, write_map
from saes.atlas_saes import load_atlas_sae
from store.layout import AtlasLayout


def run_map(
    atlas: str | Path, sae_id: str, *, k_overlap: int = 10, n_neighbors: int = 15, min_dist: float = 0.1,
    seed: int = 0, n_epochs: int | None = None, labels: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """UMAP map of an SAE's decoder rows into `saes/<id>/map.parquet` (+ `map.png`), keeping
    label columns of an earlier map unless `labels` replaces them."""
    W = load_atlas_sae(atlas, sae_id).W_dec.detach().float().numpy()
    fmap = feature_map(W, k_overlap=k_overlap, n_neighbors=n_neighbors, min_dist=min_dist, seed=seed,
                       n_epochs=n_epochs)
    keep: dict[str, np.ndarray] = {}
    if (AtlasLayout(atlas).sae_dir(sae_id) / "map.json").exists():
        old, meta = read_map(atlas, sae_id)
        if old.height == len(W):
            keep = {c: old[c].to_numpy() for c in meta.get("label_columns", [])}
    frame = map_frame(fmap, keep | (labels or {}))
    path = write_map(atlas, sae_id, frame, fmap.params, fmap.summary)
    save_png(map_figure(frame, title=f"map of {sae_id}"), path.with_name("map.png"))
    return {"frame": frame, "summary": fmap.summary, "params": fmap.params, "path": path}
