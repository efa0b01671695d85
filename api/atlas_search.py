"""Decoder-direction searches for the Atlas facade, over the store's FAISS indexes
(`store.search.FeatureSearch`: one per process, indexes loaded once, memory-mapped where
FAISS allows): similar features, nearest to a vector, cross-layer flow. Each returns the
`store.search.Match` list; `store.search.matches_frame` turns it into a table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from api import atlas_sources
from store.index import index_built, sae_index_path
from store.search import FeatureSearch, Filters, Match


def _search(cache: atlas_sources.ResourceCache, root: Path) -> FeatureSearch:
    return cache.get(("feature-search",), lambda: FeatureSearch(root))


def has_index(root: Path, sae_id: str) -> bool:
    """Whether the SAE's decoder index has been built (`sae-atlas index`); a sidecar whose
    index file is missing counts as built, so that loading it names the missing file."""
    return index_built(sae_index_path(root, sae_id))


def similar(cache: atlas_sources.ResourceCache, root: Path, sae_id: str, latent: int, k: int) -> list[Match]:
    """The `k` nearest other latents of one SAE by decoder cosine (sae_id, latent, cosine, rank, layer)."""
    return _search(cache, root).similar(sae_id, latent, k)


def by_vector(
    cache: atlas_sources.ResourceCache, root: Path, sae_ids: list[str], vector_D: np.ndarray, k: int,
    filters: Filters = Filters(),
) -> list[Match]:
    """The `k` latents over `sae_ids` whose decoder directions are nearest to `vector_D`
    (and pass `filters`, e.g. the geometry filters)."""
    search = _search(cache, root)
    if len(sae_ids) == 1:
        return search.by_vector(vector_D, k, sae_id=sae_ids[0], filters=filters)
    return search.by_vector(vector_D, k, filters=replace(filters, sae_ids=tuple(sae_ids)))


def cross_layer(
    cache: atlas_sources.ResourceCache, root: Path, sae_id: str, latent: int, k: int,
    among: list[str] | None = None,
) -> list[Match]:
    """This latent's `k` best matches in every other SAE of the same width (or of those
    in `among`), by layer."""
    filters = Filters() if among is None else Filters(sae_ids=tuple(among))
    return _search(cache, root).flow(sae_id, latent, k=k, filters=filters)


def load_index(cache: atlas_sources.ResourceCache, root: Path, sae_id: str) -> None:
    """Load (and keep) the SAE's index, checked against its current weights."""
    _search(cache, root).sae_index(sae_id)


def preload(cache: atlas_sources.ResourceCache, root: Path, sae_ids: list[str]) -> None:
    """Load the indexes of `sae_ids` and build the neighbour tables of every pair of them
    with the same residual width."""
    search = _search(cache, root)
    width = {sae_id: search.sae_index(sae_id)[1]["d"] for sae_id in sae_ids}
    for source in sae_ids:
        for target in sae_ids:
            if width[source] == width[target]:
                search.neighbour_table(source, target)
