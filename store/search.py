"""The persistence layer of `search`; its other layers: `sae_atlas.api.commands.search` (CLI),
`sae_atlas.api.http.routers.search` (HTTP), `sae_atlas.api.operations.search` (parameter),
`sae_atlas.api.results.search` (typed-result), `sae_atlas.api.services.search` (service).

Feature search over the atlas' FAISS indexes: similar features, nearest to a vector,
cross-layer flow, with density / dead / SAE / layer filters and geometry filters (circle
membership, period, lobe) from `store.feature_records`.

`FeatureSearch(root)` loads each index once (memory-mapped where FAISS allows) and keeps
it for the life of the object, so one query costs one index search. Unfiltered `similar`
and `flow` lookups, the ones every feature page makes, are answered from neighbour tables
(`store.neighbour_tables`: each latent's `TABLE_K` nearest rows in an SAE, exact like the
index): computed for a small pair of SAEs on first use, memory-mapped from the files
`sae-atlas index` wrote for a large one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.store.atomic import file_version
from sae_atlas.store.feature_records import geometry_mask, read_records, record_paths
from sae_atlas.store.index import (
    SearchIndex,
    check_build_complete,
    check_index_weights,
    combined_weights_sha256,
    load_index,
    model_index_path,
    model_members,
    read_decoder,
    sae_index_path,
)
from sae_atlas.store.integrity import WEIGHTS_SHA256, verify_sae_weights
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.neighbour_tables import TABLE_MAX_PAIRS, Table, load_table, nearest_rows
from sae_atlas.store.tables import FEATURES_FILE, TABLES_FILE, read_table

MAX_K = 1000
_OVERFETCH = 4
Densities = Mapping[str, np.ndarray] | Callable[[str], np.ndarray | None]
MATCH_SCHEMA = {"sae_id": pl.String, "latent": pl.Int64, "cosine": pl.Float64, "rank": pl.Int64, "layer": pl.Int64}


@dataclass(frozen=True)
class Match:
    """One search hit."""

    sae_id: str
    latent: int
    cosine: float
    rank: int
    layer: int

    def as_row(self) -> dict[str, Any]:
        """The match as a dict with the columns of `matches_frame`."""
        return {"sae_id": self.sae_id, "latent": self.latent, "cosine": self.cosine, "rank": self.rank,
                "layer": self.layer}


@dataclass(frozen=True)
class Filters:
    """Which features may be returned."""

    min_density: float | None = None
    max_density: float | None = None
    exclude_dead: bool = False
    sae_ids: tuple[str, ...] | None = None
    layers: tuple[int, ...] | None = None
    in_circle: bool | None = None  # member of a circle (geometry.parquet); False: of none
    period: float | None = None  # in a circle of this fitted period (within 0.5)
    lobe: int | None = None  # in this co-occurrence lobe

    @property
    def needs_density(self) -> bool:
        return self.exclude_dead or self.min_density is not None or self.max_density is not None

    @property
    def needs_geometry(self) -> bool:
        return self.in_circle is not None or self.period is not None or self.lobe is not None


def matches_frame(matches: list[Match]) -> pl.DataFrame:
    """Matches as a polars frame with columns sae_id, latent, cosine, rank, layer."""
    return pl.DataFrame([m.as_row() for m in matches], schema=MATCH_SCHEMA)


class FeatureSearch:
    """Searches over one atlas; thread-safe lazy loading of indexes and densities.

    `densities` supplies per-latent firing densities `[d_sae]` for the density and dead
    filters: a mapping from SAE id, or a callable returning the array (or None); SAEs it
    does not cover fall back to their `features.parquet` (written by `sae-atlas summarize`).
    """

    def __init__(self, root: str | Path, *, densities: Densities | None = None) -> None:
        self.root = Path(root)
        self.layout = AtlasLayout(root)
        self._provider = densities
        self._lock = threading.Lock()
        self._sae: dict[str, tuple[SearchIndex, dict[str, Any]]] = {}
        self._model: tuple[SearchIndex, dict[str, Any]] | None = None
        self._densities: dict[str, tuple[str, np.ndarray]] = {}  # SAE id -> (tables.json version, densities)
        self._rows: dict[str, np.ndarray] = {}
        self._shas: dict[str, str] = {}
        self._tables: dict[tuple[str, str], Table | None] = {}
        self._geometry: dict[tuple[Any, ...], np.ndarray] = {}

    # loading ---------------------------------------------------------------------------
    def sae_index(self, sae_id: str) -> tuple[SearchIndex, dict[str, Any]]:
        """The SAE's index and sidecar (checked against its current weights)."""
        with self._lock:
            if sae_id not in self._sae:
                check_build_complete(self.root)
                dec = read_decoder(self.root, sae_id)
                self._rows[sae_id], self._shas[sae_id] = dec.rows, dec.weights_sha256
                self._sae[sae_id] = load_index(sae_index_path(self.root, sae_id), self.root,
                                               {WEIGHTS_SHA256: dec.weights_sha256})
            return self._sae[sae_id]

    def model_index(self) -> tuple[SearchIndex, dict[str, Any]]:
        """The model-wide index over every SAE, with its id map. An SAE whose weights changed
        since the build is named by its own stale index before the model-wide one is read."""
        with self._lock:
            if self._model is None:
                check_build_complete(self.root)
                offsets = []
                for sae_id in model_members(self.root)[0]:
                    offsets.append({"sae_id": sae_id, WEIGHTS_SHA256: verify_sae_weights(self.root, sae_id)})
                    check_index_weights(self.root, sae_id)
                self._model = load_index(model_index_path(self.root), self.root,
                                         {WEIGHTS_SHA256: combined_weights_sha256(offsets)})
            return self._model

    def decoder_row(self, sae_id: str, latent: int) -> np.ndarray:
        """Unit decoder row of a feature (NotFoundError for an out-of-range latent)."""
        self.sae_index(sae_id)
        rows = self._rows[sae_id]
        if not 0 <= latent < len(rows):
            raise NotFoundError(f"SAE {sae_id!r} has latents 0..{len(rows) - 1}, not {latent}")
        return rows[latent]

    def density(self, sae_id: str) -> np.ndarray:
        """Per-latent firing density: from the `densities` given, else features.parquet; read
        again when the SAE's summary tables were rewritten (tables.json changed)."""
        version = file_version(self.layout.sae_dir(sae_id) / TABLES_FILE)
        held = self._densities.get(sae_id)
        if held is not None and held[0] == version:
            return held[1]
        values = self._provided_density(sae_id)
        if values is None:
            values = read_table(self.root, sae_id, FEATURES_FILE).sort("latent")["density"].to_numpy()
        n = self.sae_index(sae_id)[0].ntotal
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if values.shape != (n,):
            raise InvalidInputError(f"densities for SAE {sae_id!r} have {values.size} entries; it has {n} latents")
        self._densities[sae_id] = (version, values)
        return values

    def _provided_density(self, sae_id: str) -> np.ndarray | None:
        if self._provider is None:
            return None
        if callable(self._provider):
            return self._provider(sae_id)
        return self._provider.get(sae_id)

    # filtering -------------------------------------------------------------------------
    def _allowed(self, sae_id: str, layer: int, latent: int, filters: Filters) -> bool:
        if filters.sae_ids is not None and sae_id not in filters.sae_ids:
            return False
        if filters.layers is not None and layer not in filters.layers:
            return False
        if filters.needs_geometry and not self._geometry_allowed(sae_id, latent, filters):
            return False
        if not filters.needs_density:
            return True
        dens = float(self.density(sae_id)[latent])
        if filters.exclude_dead and dens == 0:
            return False
        if filters.min_density is not None and dens < filters.min_density:
            return False
        return filters.max_density is None or dens <= filters.max_density

    def _geometry_allowed(self, sae_id: str, latent: int, filters: Filters) -> bool:
        """The geometry filters against the SAE's geometry records (read once per version)."""
        version = file_version(record_paths(self.root, sae_id, "geometry")[1])
        key = (sae_id, filters.in_circle, filters.period, filters.lobe, version)
        if key not in self._geometry:
            records = read_records(self.root, sae_id, "geometry")
            self._geometry[key] = geometry_mask(records, self.sae_index(sae_id)[0].ntotal, in_circle=filters.in_circle,
                                                period=filters.period, lobe=filters.lobe)
        return bool(self._geometry[key][latent])

    def _hits(self, index: SearchIndex, resolve: Any, query: np.ndarray, k: int, filters: Filters,
              skip: tuple[str, int] | None) -> list[Match]:
        fetch = min(index.ntotal, (k + 1) * _OVERFETCH if (filters.needs_density or filters.needs_geometry or filters.sae_ids
                                                          or filters.layers) else k + 1)
        while True:
            scores, ids = index.search(query[None, :], fetch)
            out = []
            for score, idx in zip(scores[0].tolist(), ids[0].tolist(), strict=True):
                if idx < 0:
                    continue
                sae_id, latent, layer = resolve(idx)
                if (sae_id, latent) == skip or not self._allowed(sae_id, layer, latent, filters):
                    continue
                out.append(Match(sae_id, latent, float(score), len(out), layer))
                if len(out) == k:
                    return out
            if fetch >= index.ntotal:
                return out
            fetch = min(index.ntotal, fetch * 4)

    # neighbour tables ----------------------------------------------------------------------
    def neighbour_table(self, source: str, target: str) -> Table | None:
        """Every `source` latent's `TABLE_K` nearest `target` decoder rows (ids, cosines; best
        first): computed once when the pair has at most `TABLE_MAX_PAIRS` row pairs, else the
        table `sae-atlas index` wrote, memory-mapped; None when there is none that is current
        (then searches go to the index)."""
        key = (source, target)
        if key not in self._tables:
            self.sae_index(source)
            self.sae_index(target)
            a, b = self._rows[source], self._rows[target]
            if len(a) * len(b) <= TABLE_MAX_PAIRS:
                table: Table | None = nearest_rows(a, b)[0]
            else:
                table = load_table(self.root, source, target, self._shas[source], self._shas[target])
            with self._lock:
                self._tables[key] = table
        return self._tables[key]

    def _table_hits(self, source: str, latent: int, target: str, k: int) -> list[Match] | None:
        """The `k` best `target` matches of a `source` latent from its neighbour table (the
        latent itself left out), or None when no table covers `k`."""
        table = self.neighbour_table(source, target)
        if table is None:
            return None
        ids, scores = table[0][latent], table[1][latent]
        keep = ids != latent if source == target else np.ones(len(ids), dtype=bool)
        if keep.sum() < k and len(ids) < len(self._rows[target]) - (source == target):
            return None
        layer = self.sae_index(target)[1]["layer"]
        return [Match(target, int(i), float(c), rank, layer)
                for rank, (i, c) in enumerate(zip(ids[keep][:k].tolist(), scores[keep][:k].tolist(), strict=True))]

    # queries ---------------------------------------------------------------------------
    def _check_k(self, k: int) -> None:
        if not 1 <= k <= MAX_K:
            raise InvalidInputError(f"k must be between 1 and {MAX_K}, got {k}")

    def _resolver_sae(self, sae_id: str) -> Any:
        layer = self.sae_index(sae_id)[1]["layer"]
        return lambda idx: (sae_id, idx, layer)

    def _resolver_model(self) -> Any:
        saes = self.model_index()[1]["saes"]
        starts = np.array([s["start"] for s in saes])

        def resolve(idx: int) -> tuple[str, int, int]:
            entry = saes[int(np.searchsorted(starts, idx, side="right") - 1)]
            return entry["sae_id"], idx - entry["start"], entry["layer"]

        return resolve

    def similar(self, sae_id: str, latent: int, k: int = 10, *, across_saes: bool = False,
                filters: Filters = Filters()) -> list[Match]:
        """Features whose decoder rows are nearest (cosine) to this feature's, itself excluded."""
        self._check_k(k)
        query = self.decoder_row(sae_id, latent)
        if across_saes:
            index, _ = self.model_index()
            return self._hits(index, self._resolver_model(), query, k, filters, (sae_id, latent))
        if filters == Filters():
            table = self._table_hits(sae_id, latent, sae_id, k)
            if table is not None:
                return table
        index, _ = self.sae_index(sae_id)
        return self._hits(index, self._resolver_sae(sae_id), query, k, filters, (sae_id, latent))

    def by_vector(self, vector: np.ndarray, k: int = 10, *, sae_id: str | None = None,
                  filters: Filters = Filters()) -> list[Match]:
        """Features nearest (cosine) to a residual-space vector, in one SAE or across all."""
        self._check_k(k)
        vec = np.asarray(vector, dtype=np.float32).reshape(-1)
        index, info = self.sae_index(sae_id) if sae_id else self.model_index()
        if vec.shape[0] != info["d"]:
            raise InvalidInputError(f"vector has dimension {vec.shape[0]}; the SAEs' residual space has d={info['d']}")
        if not np.isfinite(vec).all() or not np.linalg.norm(vec) > 0:
            raise InvalidInputError("vector must be finite and non-zero")
        query = unit_rows(vec[None, :])[0]
        resolve = self._resolver_sae(sae_id) if sae_id else self._resolver_model()
        return self._hits(index, resolve, query, k, filters, None)

    def flow(self, sae_id: str, latent: int, *, k: int = 1, filters: Filters = Filters()) -> list[Match]:
        """Cross-layer feature flow: this feature's `k` best matches in every other SAE of the
        same residual width (the SAE / layer / density filters apply), ordered by layer."""
        self._check_k(k)
        query = self.decoder_row(sae_id, latent)
        matches = []
        for other in self.layout.sae_ids():
            if other == sae_id or (filters.sae_ids is not None and other not in filters.sae_ids):
                continue
            index, info = self.sae_index(other)
            if info["d"] != query.shape[0] or (filters.layers is not None and info["layer"] not in filters.layers):
                continue
            table = None if filters.needs_density or filters.needs_geometry else self._table_hits(
                sae_id, latent, other, k)
            matches.extend(table if table is not None else
                           self._hits(index, self._resolver_sae(other), query, k, filters, None))
        return sorted(matches, key=lambda m: (m.layer, m.sae_id, m.rank))
