"""The persistence layer of `steering`; its other layers: `sae_atlas.api.http.routers.steering`
(HTTP), `sae_atlas.api.operations.steering` (parameter), `sae_atlas.api.results.steering`
(typed-result), `sae_atlas.api.services.steering` (service).

An SAE's steering table: `saes/<id>/steering.parquet` and its sidecar `steering.json`.

One row per latent: the steering strength used, the output score, KL(clean || steered) and
the tokens whose next-token log-probability rose or fell most (schema in `STEERING_SCHEMA`,
computed by `saes.intervene.output_scores`). The sidecar, written last, records the
parameters, the table's sha256 and row count and the sha256 of the SAE weights it came
from; `read_steering` verifies all of it and raises `IntegrityError` naming the file.

A run is written in chunks of latents under `saes/<id>/.steering-chunks/` (each chunk file
atomic, `params.json` naming the run they belong to), so a killed run restarts after its
last finished chunk; `finish` joins them into the table and removes the folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.errors import IntegrityError, NotFoundError
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.frames import conform
from sae_atlas.store.integrity import check_weights_record, weights_record
from sae_atlas.store.layout import AtlasLayout, created_with

STEERING_FILE = "steering.parquet"
STEERING_META = "steering.json"
CHUNKS_DIR = ".steering-chunks"
STEERING_SCHEMA_VERSION = 1

STEERING_SCHEMA: dict[str, pl.DataType] = {
    "latent": pl.Int32(),
    "alpha": pl.Float32(),
    "output_score": pl.Float32(),
    "lens_top_prob": pl.Float32(),
    "lens_best_rank": pl.Float32(),
    "kl": pl.Float32(),
    "promoted_ids": pl.List(pl.Int32()),
    "promoted_deltas": pl.List(pl.Float32()),
    "suppressed_ids": pl.List(pl.Int32()),
    "suppressed_deltas": pl.List(pl.Float32()),
}


def steering_repair(root: str | Path, sae_id: str) -> str:
    """The command that rebuilds an SAE's steering table."""
    return f"re-run `sae-atlas steering-scores {root} --sae {sae_id}`"


class SteeringChunks:
    """The finished chunks of one steering run of an SAE; chunks of a run with other
    parameters or other weights are discarded when it starts."""

    def __init__(self, root: str | Path, sae_id: str, params: dict[str, Any]) -> None:
        self.root, self.sae_id = Path(root), sae_id
        self.folder = AtlasLayout(root).require_sae(sae_id) / CHUNKS_DIR
        self.run = {"params": params, **weights_record(root, sae_id)}
        marker = self.folder / "params.json"
        if marker.exists() and read_json(marker, f"delete {self.folder}") != self.run:
            shutil.rmtree(self.folder)
        self.folder.mkdir(exist_ok=True)
        atomic_write_json(marker, self.run)

    def _path(self, index: int) -> Path:
        return self.folder / f"chunk-{index:06d}.parquet"

    def done(self, index: int) -> bool:
        """Whether chunk `index` was finished by this run or an earlier, killed one."""
        return self._path(index).exists()

    def write(self, index: int, frame: pl.DataFrame) -> None:
        """Store chunk `index` (atomically)."""
        frame = conform(frame, STEERING_SCHEMA, f"steering chunk {index} of {self.sae_id}")
        with atomic_path(self._path(index)) as tmp:
            frame.write_parquet(tmp)

    def finish(self, n_chunks: int) -> Path:
        """Join chunks `0..n_chunks-1` into `steering.parquet`, write its sidecar last and
        remove the chunks; returns the table's path."""
        frame = pl.concat([pl.read_parquet(self._path(i)) for i in range(n_chunks)]).sort("latent")
        path = self.folder.parent / STEERING_FILE
        with atomic_path(path) as tmp:
            frame.write_parquet(tmp, compression="zstd")
        atomic_write_json(self.folder.parent / STEERING_META, {
            "schema_version": STEERING_SCHEMA_VERSION, "rows": frame.height, "sha256": sha256_file(path),
            **self.run, "created_with": created_with()})
        shutil.rmtree(self.folder)
        return path


def steering_is_current(root: str | Path, sae_id: str, params: dict[str, Any]) -> bool:
    """Whether the SAE's steering table verifies (`read_steering`: intact, from the current
    weights) and was computed with `params` (the run's parameters), so that running it again
    would write the same table."""
    try:
        _, meta = read_steering(root, sae_id)
    except (NotFoundError, IntegrityError):
        return False
    return bool(meta.get("params") == params)


def read_steering(root: str | Path, sae_id: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The verified steering table of an SAE and its sidecar (NotFoundError when none was
    computed; IntegrityError naming the file when it is damaged or from other weights)."""
    folder = AtlasLayout(root).require_sae(sae_id)
    path, meta_path = folder / STEERING_FILE, folder / STEERING_META
    repair = steering_repair(root, sae_id)
    if not meta_path.exists():
        if path.exists():
            raise IntegrityError(meta_path, "is missing beside its table (an interrupted write)", repair)
        raise NotFoundError(f"SAE {sae_id!r} has no steering scores yet; compute them with "
                            f"`sae-atlas steering-scores {root} --sae {sae_id}`")
    meta = read_json(meta_path, repair)
    if not path.exists():
        raise IntegrityError(path, "is missing", repair)
    if sha256_file(path) != meta.get("sha256"):
        raise IntegrityError(path, f"sha256 does not match {STEERING_META} (corrupt or truncated)", repair)
    frame = pl.read_parquet(path)
    if dict(frame.schema) != STEERING_SCHEMA or frame.height != meta.get("rows"):
        raise IntegrityError(path, f"schema or row count differs from what {STEERING_META} records", repair)
    check_weights_record(root, sae_id, meta, path, repair)
    return frame, meta
