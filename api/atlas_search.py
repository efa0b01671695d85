"""Decoder-direction searches for the Atlas facade: similar features, by vector, cross-layer.

Each SAE's unit-normalised decoder rows go into one exact inner-product FAISS index per
process (cosine = inner product of unit rows), built on first use and shared by all
requests.
"""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import polars as pl

from api import atlas_sources
from geometry.clusters import unit_rows
from store.layout import AtlasLayout

_SCHEMA = {"sae_id": pl.String, "latent": pl.Int64, "cosine": pl.Float64}


def _index(cache: atlas_sources.ResourceCache, root: Path, sae_id: str) -> tuple[faiss.Index, np.ndarray]:
    def build() -> tuple[faiss.Index, np.ndarray]:
        unit_FD = unit_rows(atlas_sources.load_sae(root, sae_id).W_dec.detach().float().numpy())
        index = faiss.IndexFlatIP(unit_FD.shape[1])
        index.add(unit_FD)
        return index, unit_FD

    return cache.get(("decoder-index", sae_id), build)


def _search(index: faiss.Index, query_D: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    q = np.ascontiguousarray(query_D.reshape(1, -1) / max(float(np.linalg.norm(query_D)), 1e-12), np.float32)
    sims, ids = index.search(q, min(k, index.ntotal))
    keep = ids[0] >= 0
    return sims[0][keep], ids[0][keep]


def _frame(sae_id: str, sims: np.ndarray, ids: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"sae_id": [sae_id] * len(ids), "latent": ids.astype(np.int64),
                         "cosine": sims.astype(np.float64)}, schema=_SCHEMA)


def similar(cache: atlas_sources.ResourceCache, root: Path, sae_id: str, latent: int, k: int) -> pl.DataFrame:
    """The `k` nearest other latents of one SAE by decoder cosine."""
    index, unit_FD = _index(cache, root, sae_id)
    sims, ids = _search(index, unit_FD[latent], k + 1)
    keep = ids != latent
    return _frame(sae_id, sims[keep][:k], ids[keep][:k])


def by_vector(
    cache: atlas_sources.ResourceCache, root: Path, sae_ids: list[str], vector_D: np.ndarray, k: int
) -> pl.DataFrame:
    """The `k` latents over `sae_ids` whose decoder directions are nearest to `vector_D`."""
    frames = [_frame(sid, *_search(_index(cache, root, sid)[0], vector_D, k)) for sid in sae_ids]
    if not frames:
        return pl.DataFrame(schema=_SCHEMA)
    return pl.concat(frames).sort("cosine", descending=True).head(k)


def cross_layer(
    cache: atlas_sources.ResourceCache, root: Path, sae_id: str, latent: int, k: int
) -> pl.DataFrame:
    """Per other SAE of the same width, its `k` best matches to this latent's decoder row."""
    _, unit_FD = _index(cache, root, sae_id)
    others = [s for s in AtlasLayout(root).sae_ids() if s != sae_id
              and _index(cache, root, s)[1].shape[1] == unit_FD.shape[1]]
    frames = [_frame(s, *_search(_index(cache, root, s)[0], unit_FD[latent], k)) for s in others]
    if not frames:
        return pl.DataFrame(schema=_SCHEMA)
    return pl.concat(frames)

