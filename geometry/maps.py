"""2-D maps of an SAE's features: UMAP (McInnes et al. 2018) of the unit decoder rows with
the cosine metric, seeded, stored per feature in `saes/<sae_id>/map.parquet` (columns
latent, x, y, knn_overlap and any attached cluster-label columns) with a `map.json`
sidecar (parameters, checksum, created_with).

The kNN-overlap score is the fraction of each feature's `k` nearest neighbours (by
cosine in the full space) that are also among its `k` nearest in the map; its mean says
how far the map can be trusted, beside the chance level `k / (F - 1)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import polars as pl

from geometry.clusters import knn_cosine
from store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from store.errors import IntegrityError, InvalidInputError
from store.layout import AtlasLayout, created_with
from store.vectors import unit_rows

MAP_FILE, MAP_META = "map.parquet", "map.json"
BASE_COLUMNS = ("latent", "x", "y", "knn_overlap")


def umap_coords(
    W_dec_FD: np.ndarray, *, n_neighbors: int = 15, min_dist: float = 0.1, seed: int = 0, n_epochs: int | None = None
) -> np.ndarray:
    """Seeded 2-D UMAP coordinates `[F, 2]` of the unit decoder rows (cosine metric)."""
    import umap  # slow import (numba); only when a map is made

    unit = unit_rows(W_dec_FD)
    if unit.shape[0] <= n_neighbors:
        raise InvalidInputError(f"a map needs more features ({unit.shape[0]}) than n_neighbors ({n_neighbors})")
    reducer = umap.UMAP(n_neighbors=n_neighbors, min_dist=min_dist, metric="cosine", random_state=seed,
                        n_epochs=n_epochs, n_components=2, n_jobs=1)
    return np.asarray(reducer.fit_transform(unit), dtype=np.float32)


def _knn_l2(X: np.ndarray, k: int, batch: int = 8192) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=np.float32)
    index = faiss.IndexFlatL2(X.shape[1])
    index.add(X)
    out = np.empty((len(X), k), dtype=np.int64)
    for start in range(0, len(X), batch):
        stop = min(start + batch, len(X))
        _, nbrs = index.search(X[start:stop], k + 1)
        keep = nbrs != np.arange(start, stop)[:, None]
        keep[keep.all(axis=1), -1] = False
        out[start:stop] = nbrs[keep].reshape(stop - start, k)
    return out


def knn_overlap(W_dec_FD: np.ndarray, coords_F2: np.ndarray, k: int = 10) -> np.ndarray:
    """Per feature, the share of its `k` cosine neighbours (full space) kept among its `k`
    nearest neighbours in the map."""
    unit = unit_rows(W_dec_FD)
    coords = np.asarray(coords_F2, dtype=np.float32)
    if coords.shape != (unit.shape[0], 2):
        raise InvalidInputError(f"coordinates must be [{unit.shape[0]}, 2], got {coords.shape}")
    if not 1 <= k < unit.shape[0]:
        raise InvalidInputError(f"k must be in 1..{unit.shape[0] - 1}, got {k}")
    _, high = knn_cosine(unit, k)
    low = _knn_l2(coords, k)
    hits = (np.sort(high, axis=1)[:, :, None] == np.sort(low, axis=1)[:, None, :]).any(axis=2).sum(axis=1)
    return hits / k


@dataclass
class FeatureMap:
    """A map of one SAE: coordinates, per-feature overlap, and the parameters used."""

    coords_F2: np.ndarray
    overlap_F: np.ndarray
    params: dict[str, Any]

    @property
    def summary(self) -> dict[str, float]:
        n, k = len(self.overlap_F), self.params["k_overlap"]
        return {"knn_overlap_mean": float(self.overlap_F.mean()), "knn_overlap_median": float(np.median(self.overlap_F)),
                "chance": k / max(n - 1, 1), "n_features": n}


def feature_map(
    W_dec_FD: np.ndarray, *, k_overlap: int = 10, n_neighbors: int = 15, min_dist: float = 0.1, seed: int = 0,
    n_epochs: int | None = None,
) -> FeatureMap:
    """UMAP the decoder rows and score the map's neighbourhood preservation."""
    coords = umap_coords(W_dec_FD, n_neighbors=n_neighbors, min_dist=min_dist, seed=seed, n_epochs=n_epochs)
    params = {"method": "umap", "metric": "cosine", "n_neighbors": n_neighbors, "min_dist": min_dist,
              "seed": seed, "n_epochs": n_epochs, "k_overlap": k_overlap}
    return FeatureMap(coords, knn_overlap(W_dec_FD, coords, k_overlap), params)


def map_frame(fmap: FeatureMap, labels: dict[str, np.ndarray] | None = None) -> pl.DataFrame:
    """The per-feature map table: latent, x, y, knn_overlap, then one column per label set."""
    n = len(fmap.coords_F2)
    frame = pl.DataFrame({"latent": np.arange(n, dtype=np.int32), "x": fmap.coords_F2[:, 0],
                          "y": fmap.coords_F2[:, 1], "knn_overlap": fmap.overlap_F.astype(np.float32)})
    return with_labels(frame, labels or {})


def with_labels(frame: pl.DataFrame, labels: dict[str, np.ndarray]) -> pl.DataFrame:
    """`frame` with label columns added or replaced (one int64 label per feature; -1 = none)."""
    for name, values in labels.items():
        if name in BASE_COLUMNS:
            raise InvalidInputError(f"label column name {name!r} is reserved; pick another")
        arr = np.asarray(values, dtype=np.int64)
        if arr.shape != (frame.height,):
            raise InvalidInputError(f"labels {name!r} must have one entry per feature ({frame.height}), got {arr.shape}")
        frame = frame.with_columns(pl.Series(name, arr))
    return frame


def labels_from_clusters(clusters: list[np.ndarray], n_features: int) -> np.ndarray:
    """Cluster lists (feature index arrays) as a label per feature; -1 for unclustered."""
    labels = np.full(n_features, -1, dtype=np.int64)
    for i, members in enumerate(clusters):
        labels[np.asarray(members, dtype=np.int64)] = i
    return labels


def _repair(root: str | Path, sae_id: str) -> str:
    return f"re-run `sae-atlas analyze map --atlas {root} --sae {sae_id}`"


def write_map(root: str | Path, sae_id: str, frame: pl.DataFrame, params: dict[str, Any],
              summary: dict[str, Any] | None = None) -> Path:
    """Write `map.parquet` then its `map.json` sidecar atomically; return the parquet path."""
    missing = [c for c in BASE_COLUMNS if c not in frame.columns]
    if missing:
        raise InvalidInputError(f"map table lacks columns {missing}")
    folder = AtlasLayout(root).require_sae(sae_id)
    path = folder / MAP_FILE
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp, compression="zstd")
    atomic_write_json(folder / MAP_META, {
        "sae_id": sae_id, "sha256": sha256_file(path), "rows": frame.height, "params": params,
        "summary": summary or {}, "label_columns": [c for c in frame.columns if c not in BASE_COLUMNS],
        "created_with": created_with()})
    return path


def read_map(root: str | Path, sae_id: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The verified map table of an SAE and its sidecar."""
    folder = AtlasLayout(root).require_sae(sae_id)
    meta = read_json(folder / MAP_META, _repair(root, sae_id))
    path = folder / MAP_FILE
    if not path.exists() or sha256_file(path) != meta.get("sha256"):
        raise IntegrityError(path, "missing or its sha256 does not match map.json", _repair(root, sae_id))
    return pl.read_parquet(path), meta


def attach_labels(root: str | Path, sae_id: str, labels: dict[str, np.ndarray]) -> Path:
    """Add (or replace) cluster-label columns of a stored map, e.g. lobes or circular clusters."""
    frame, meta = read_map(root, sae_id)
    return write_map(root, sae_id, with_labels(frame, labels), meta["params"], meta.get("summary"))
