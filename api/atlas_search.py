"""Decoder-direction searches for the Atlas facade, over the store's FAISS indexes
(`store.search.FeatureSearch`: one per process, indexes loaded once, memory-mapped where
FAISS allows): similar features, nearest to a vector, cross-layer flow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from api import atlas_sources
from store.index import sae_index_path
from store.search import FeatureSearch, Filters, matches_frame


def _search(cache: atlas_sources.ResourceCache, root: Path) -> FeatureSearch:
    return cache.get(("feature-search",), lambda: FeatureSearch(root))


def has_index(root: Path, sae_id: str) -> bool:
    """Whether the SAE's decoder index has been built (`sae-atlas index`)."""
    return sae_index_path(root, sae_id).exists()


def similar(cache: atlas_sources.ResourceCache, root: Path, sae_id: str, latent: int, k: int) -> pl.DataFrame:
    """The `k` nearest other latents of one SAE by decoder cosine (sae_id, latent, cosine, rank, layer)."""
    return matches_frame(_search(cache, root).similar(sae_id, latent, k))


def by_vector(
    cache: atlas_sources.ResourceCache, root: Path, sae_ids: list[str], vector_D: np.ndarray, k: int
) -> pl.DataFrame:
    """The `k` latents over `sae_ids` whose decoder directions are nearest to `vector_D`."""
    search = _search(cache, root)
    if len(sae_ids) == 1:
        return matches_frame(search.by_vector(vector_D, k, sae_id=sae_ids[0]))
    return matches_frame(search.by_vector(vector_D, k, filters=Filters(sae_ids=tuple(sae_ids))))


def cross_layer(
    cache: atlas_sources.ResourceCache, root: Path, sae_id: str, latent: int, k: int
) -> pl.DataFrame:
    """This latent's `k` best matches in every other SAE of the same width, by layer."""
    return matches_frame(_search(cache, root).flow(sae_id, latent, k=k))
