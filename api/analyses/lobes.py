"""The analysis-run layer of `lobes`; its other layers: `sae_atlas.geometry.lobes` (maths).

Co-occurrence lobes of an SAE compared with its geometric clusters (`analyses/lobes/`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.api.analyses.run_files import run_figure
from sae_atlas.geometry.clusters import spectral_clusters
from sae_atlas.geometry.figures import lobes_figure
from sae_atlas.geometry.lobes import compare_labels, cooccurrence_knn, spectral_lobes
from sae_atlas.geometry.maps import labels_from_clusters
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.store.analysis_runs import write_analysis
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.maps import attach_labels
from sae_atlas.store.tables import load_occurrence


def run_lobes(
    atlas: str | Path, sae_id: str, *, measure: str = "jaccard", k: int = 20, n_clusters: int = 10,
    n_perm: int = 100, seed: int = 0, run: str | None = None,
) -> dict[str, Any]:
    """Co-occurrence lobes of an SAE (from its summary's occurrence matrix), compared by AMI
    with spectral clusters of its decoder rows; labels are attached to its map if any."""
    occ, _ = load_occurrence(atlas, sae_id)
    lobes = spectral_lobes(cooccurrence_knn(occ, measure=measure, k=k), n_clusters, seed=seed)
    W = load_atlas_sae(atlas, sae_id).W_dec.detach().float().numpy()
    geometric = labels_from_clusters(spectral_clusters(W, n_clusters, seed=seed, min_size=1), len(W))
    cmp = compare_labels(lobes, geometric, n_perm=n_perm, seed=seed)
    table = pl.DataFrame({"latent": np.arange(len(W), dtype=np.int32), "lobe": lobes, "geometric": geometric})
    run = run or f"{sae_id}-{measure}"
    params = {"sae_id": sae_id, "measure": measure, "k": k, "n_clusters": n_clusters, "n_perm": n_perm,
              "seed": seed, "n_blocks": int(occ.shape[0])}
    fig = run_figure(lobes_figure({"lobes vs geometric": cmp}), atlas, "lobes", run, "ami")
    js = write_analysis(atlas, "lobes", run, parameters=params, summary=cmp.__dict__, tables={"main": table},
                        extra={"figures": [fig]})
    if (AtlasLayout(atlas).sae_dir(sae_id) / "map.json").exists():
        attach_labels(atlas, sae_id, {f"lobe_{measure}": lobes, "geometric": geometric})
    return {"comparison": cmp, "table": table, "params": params, "json_path": js}
