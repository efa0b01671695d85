"""The analysis-run layer of `maps`; its other layers: `sae_atlas.store.maps` (persistence),
`sae_atlas.geometry.maps` (maths).

Feature maps: the UMAP maps of an SAE in the decoder-row basis and, once the SAE is
summarized, the activation co-occurrence basis (`saes/<id>/map.parquet` + `map.png`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from sae_atlas.errors import IntegrityError
from sae_atlas.geometry.figures import map_figure
from sae_atlas.geometry.maps import basis_maps, feature_map
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.store.atomic import save_png
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.maps import MAP_META, map_frame, read_map, stored_summary, write_map
from sae_atlas.store.tables import OCCURRENCE_FILE, load_occurrence


def run_map(
    atlas: str | Path, sae_id: str, *, k_overlap: int = 10, n_neighbors: int = 15, min_dist: float = 0.1,
    seed: int = 0, n_epochs: int | None = None, labels: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """UMAP maps of an SAE into `saes/<id>/map.parquet` (+ `map.png` of the decoder map): the
    decoder-row map, and the co-occurrence map when the SAE's occurrence matrix exists (each
    scored on both bases' neighbours); label columns of an earlier map are kept unless
    `labels` replaces them, or that map is damaged or was made from other weights (then
    the new map replaces it whole)."""
    W = load_atlas_sae(atlas, sae_id).W_dec.detach().float().numpy()
    folder = AtlasLayout(atlas).sae_dir(sae_id)
    kw: dict[str, Any] = {"k_overlap": k_overlap, "n_neighbors": n_neighbors, "min_dist": min_dist, "seed": seed,
                          "n_epochs": n_epochs}
    if (folder / OCCURRENCE_FILE).exists():
        maps = basis_maps(W, load_occurrence(atlas, sae_id)[0], **kw)
    else:
        maps = {"decoder": feature_map(W, **kw)}
    keep: dict[str, np.ndarray] = {}
    if (folder / MAP_META).exists():
        with contextlib.suppress(IntegrityError):
            old, meta = read_map(atlas, sae_id)
            if old.height == len(W):
                keep = {c: old[c].to_numpy() for c in meta.get("label_columns", [])}
    frame = map_frame(maps["decoder"], keep | (labels or {}), cooccurrence=maps.get("cooccurrence"))
    params, summary = stored_summary(maps)
    path = write_map(atlas, sae_id, frame, params, summary)
    save_png(map_figure(frame, title=f"map of {sae_id}"), path.with_name("map.png"))
    return {"frame": frame, "summary": summary, "params": params, "path": path}
