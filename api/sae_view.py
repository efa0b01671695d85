"""`SaeView`: one SAE of an atlas, its id checked once.

`open_sae(ctx, sae_id)` validates the id (a safe name whose folder holds a cfg.json, or a
named error) and returns the view; everything a page or a search reads of the SAE comes
through it: facts, summary tables, weights, map, record tables, labels and index state.
Each is loaded lazily into the context's resource cache, so every view of the same SAE
shares one copy. What `sae-atlas summarize` and the label commands rewrite while a server
runs (summary tables, record tables) is kept per version of its sidecar, so a page reads
the files as they are now, whole, and never a copy from before a rewrite beside one after.
The summary tables and the labels computed from them are read together (`SummaryReader`),
and a view keeps the pair it read first, so every answer built from one view shows one
summary with its own labels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.sae import SaeInfo
from sae_atlas.errors import AtlasError, IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.atlas_saes import atlas_sae_hook, load_atlas_sae
from sae_atlas.saes.devices import resolve_device
from sae_atlas.saes.formats.saelens import CFG_FILE, true_architecture
from sae_atlas.saes.sae.base import SAE
from sae_atlas.store.atomic import file_version, read_json
from sae_atlas.store.feature_records import AUTO_LABELS, RecordTable, read_records, record_files
from sae_atlas.store.index import index_built, sae_index_path
from sae_atlas.store.integrity import verify_sae_weights
from sae_atlas.store.locks import tables_lock
from sae_atlas.store.maps import MAP_FILE, MAP_META, Basis, basis_frame, map_scores, read_map
from sae_atlas.store.tables import FEATURES_FILE, TABLES_FILE, FeatureTables

MapScores = dict[str, dict[str, float | None]]
T = TypeVar("T")


@dataclass(frozen=True)
class Summary:
    """An SAE's summary tables and labels table as read together: each is the loaded value
    or the error reading it raised (re-raised by `SaeView`)."""

    version: tuple[str, str]  # of tables.json and labels.json
    tables: FeatureTables | AtlasError
    labels: pl.DataFrame | AtlasError


def _attempt(load: Callable[[], T]) -> T | AtlasError:
    try:
        return load()
    except AtlasError as exc:
        return exc


def _value(loaded: T | AtlasError) -> T:
    if isinstance(loaded, AtlasError):
        raise loaded.with_traceback(None)
    return loaded


class SummaryReader:
    """Reads one SAE's summary tables and labels table together under the summary's shared
    lock, again whenever either sidecar changed; while a writer holds the lock it answers
    with the pair read last at once (it waits only when it has none), so a server keeps
    answering during `sae-atlas summarize` and never shows new statistics with old labels."""

    def __init__(self, root: Path, sae_id: str, folder: Path) -> None:
        self.root, self.sae_id, self.folder = root, sae_id, folder
        self._held: Summary | None = None
        self._lock = threading.Lock()  # one read per version

    def current(self) -> Summary:
        """The pair as the files are now, or as read last while they are being replaced."""
        held = self._held
        with tables_lock(self.folder, "shared", wait=None if held is None else 0) as locked:
            if not locked and held is not None:
                return held
            version = (file_version(self.folder / TABLES_FILE), file_version(record_files(self.folder, "labels")[1]))
            with self._lock:
                if self._held is None or self._held.version != version:
                    self._held = Summary(version, _attempt(lambda: FeatureTables(self.root, self.sae_id)),
                                         _attempt(lambda: read_records(self.root, self.sae_id, "labels")))
                return self._held


class SaeView:
    """One SAE of an opened atlas (`open_sae`); its resources are loaded on first use."""

    def __init__(self, ctx: AtlasContext, sae_id: str, folder: Path) -> None:
        self.ctx = ctx
        self.sae_id = sae_id
        self.folder = folder
        self._summary: Summary | None = None

    def __repr__(self) -> str:
        return f"SaeView({self.sae_id!r})"

    def _kept(self, what: str, load: Any) -> Any:
        return self.ctx.cache.get((what, self.sae_id), load)

    # facts ----------------------------------------------------------------------------
    @property
    def info(self) -> SaeInfo:
        """Facts about the SAE from atlas.json and its cfg.json (read once, then kept)."""
        return SaeInfo(**self._kept("info", self._read_info))

    def _read_info(self) -> SaeInfo:
        cfg = read_json(self.folder / CFG_FILE, f"re-train or re-import SAE {self.sae_id!r}")
        recorded = self.ctx.recorded(self.sae_id)
        return SaeInfo(
            sae_id=self.sae_id, hook=atlas_sae_hook(self.ctx.root, self.sae_id),
            hook_out=(cfg.get("metadata") or {}).get("hook_name_out") or None,
            architecture=true_architecture(cfg), d_in=cfg.get("d_in"), d_sae=cfg.get("d_sae"),
            k=recorded.get("k"), fvu=recorded.get("fvu"), l0=recorded.get("l0"),
            dead_fraction=recorded.get("dead_fraction"),
            source=(recorded.get("source") or {}).get("source") or "trained", suspect=bool(recorded.get("suspect")))

    @property
    def hook(self) -> str:
        """The hook the SAE reads."""
        return self.info["hook"]

    @property
    def hook_out(self) -> str | None:
        """The hook a transcoder writes (None for an SAE)."""
        return self.info["hook_out"]

    @property
    def d_in(self) -> int:
        return int(self.info["d_in"])

    @property
    def d_sae(self) -> int:
        return int(self.info["d_sae"])

    def latent(self, index: Any) -> int:
        """`index` if it names a latent of this SAE: InvalidInputError for a non-integer,
        NotFoundError (404 over HTTP) for one out of range."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise InvalidInputError(f"feature index must be an integer, got {index!r}")
        if not 0 <= index < self.d_sae:
            raise NotFoundError(f"feature index {index} out of range for SAE {self.sae_id!r}: "
                                f"valid 0..{self.d_sae - 1}")
        return int(index)

    # weights ------------------------------------------------------------------------------
    def module(self, device: str | None = None) -> SAE:
        """The SAE itself in eval mode on `device` (None: the process default, `saes.devices`),
        its weights checked against their sha256; loaded once per context and device."""
        where = str(resolve_device(device))
        return self.ctx.cache.get(("sae", self.sae_id, where),
                                  lambda: load_atlas_sae(self.ctx.root, self.sae_id, device=where))

    def verify_weights(self) -> None:
        """IntegrityError naming the weights file when it is missing or differs from the
        sha256 cfg.json records (hashed once per process and file version)."""
        verify_sae_weights(self.ctx.root, self.sae_id)

    # summaries ----------------------------------------------------------------------------
    @property
    def summarized(self) -> bool:
        """Whether summary tables were written (reading them may still find damage)."""
        return (self.folder / FEATURES_FILE).exists()

    def summary(self) -> Summary:
        """The summary tables and labels table of the SAE, read together once per view
        (`SummaryReader`, shared by every view of the SAE)."""
        if self._summary is None:
            reader = self._kept("summary", lambda: SummaryReader(self.ctx.root, self.sae_id, self.folder))
            self._summary = reader.current()
        return self._summary

    def tables(self) -> FeatureTables:
        """The verified summary tables (NotFoundError if not summarized, IntegrityError if
        damaged), read again once they were rewritten (their sidecar, written last, changed)."""
        return _value(self.summary().tables)

    def feature_mean(self, latent: int) -> float | None:
        """A latent's mean activation from the summaries; None when not summarized."""
        return float(self.tables().feature(self.latent(latent))["mean_act"]) if self.summarized else None

    # map ----------------------------------------------------------------------------------
    def stored_map(self) -> tuple[pl.DataFrame, dict[str, Any]]:
        """The verified map table and its sidecar (NotFoundError when none was built)."""
        def load() -> tuple[pl.DataFrame, dict[str, Any]]:
            if not (self.folder / MAP_FILE).exists() and not (self.folder / MAP_META).exists():
                raise NotFoundError(f"SAE {self.sae_id!r} has no map yet; build it with `sae-atlas analyze map`")
            return read_map(self.ctx.root, self.sae_id)  # one file without the other is damage

        return self._kept("map", load)

    def map(self, basis: Basis = "decoder") -> pl.DataFrame:
        """The 2-D feature map in one basis (`store.maps.basis_frame`)."""
        return basis_frame(self.stored_map()[0], basis)

    def map_scores(self) -> MapScores:
        """Per built basis, how well the map keeps neighbourhoods (`store.maps.map_scores`)."""
        return map_scores(*self.stored_map())

    def map_position(self, latent: int) -> dict[str, Any] | None:
        """The latent's row of the decoder map; None when no map is built or it lacks the latent."""
        try:
            frame = self.stored_map()[0]
        except NotFoundError:
            return None
        if latent < frame.height and frame["latent"][latent] == latent:  # maps are stored in latent order
            return frame.row(latent, named=True)
        hit = frame.filter(pl.col("latent") == latent)
        return hit.row(0, named=True) if hit.height else None

    # record tables and labels ---------------------------------------------------------------
    def records(self, table: RecordTable) -> pl.DataFrame:
        """The `geometry` or `labels` record table, read once per version of its sidecar
        (written last); the labels with the summary tables (`summary`)."""
        if table == "labels":
            return _value(self.summary().labels)
        return self.ctx.cache.current(("records", self.sae_id, table),
                                      file_version(record_files(self.folder, table)[1]),
                                      lambda: read_records(self.ctx.root, self.sae_id, table))

    def labels_version(self) -> str:
        """The version of the labels table (changes whenever labels are written)."""
        return self.summary().version[1]

    def labels_by_latent(self) -> pl.DataFrame:
        """One row per labelled latent: latent, label (the offline one), explanations
        (imported texts); computed once per version of the labels table."""
        def load() -> pl.DataFrame:
            labels = self.records("labels")
            auto = labels.filter(pl.col("source") == AUTO_LABELS).select("latent", pl.col("text").alias("label"))
            imported = (labels.filter(pl.col("source") != AUTO_LABELS).group_by("latent")
                        .agg(pl.col("text").sort().alias("explanations")))
            return auto.join(imported, on="latent", how="full", coalesce=True).with_columns(
                pl.col("latent").cast(pl.Int64), pl.col("explanations").cast(pl.List(pl.String)))

        return self.ctx.cache.current(("labels-by-latent", self.sae_id), self.labels_version(), load)

    # index and damage -----------------------------------------------------------------------
    @cached_property
    def has_index(self) -> bool:
        """Whether the decoder index was built (`sae-atlas index`); a sidecar whose index file
        is missing counts as built, so that loading it names the missing file."""
        return index_built(sae_index_path(self.ctx.root, self.sae_id))

    def damage(self) -> IntegrityError | None:
        """What makes the SAE unservable: the IntegrityError of a missing, truncated or
        mismatched file among its config, weights, summary tables, map and index; None when
        they verify (or are not built yet). Loads and keeps what its pages read, so the first
        call is the SAE's preload; the answer is kept for the life of the context."""
        def check() -> IntegrityError | None:
            try:
                _ = self.info
                self.verify_weights()
                for load in (self.tables, self.stored_map):
                    try:
                        load()
                    except NotFoundError:  # not summarized / no map yet: pages show what exists
                        pass
                for table in ("labels", "geometry"):
                    self.records(table)
                if self.has_index:
                    self.ctx.search().sae_index(self.sae_id)
            except IntegrityError as exc:
                return exc
            return None

        return self._kept("damage", check)


def open_sae(ctx: AtlasContext, sae_id: str) -> SaeView:
    """The view of SAE `sae_id`: InvalidInputError for an unsafe id, NotFoundError listing the
    valid ids for an unknown one, IntegrityError for one registered without its cfg.json."""
    return SaeView(ctx, sae_id, ctx.layout.require_sae(sae_id))
