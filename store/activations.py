"""The activation cache of one hook: safetensors shards plus a manifest.

Each shard holds whole blocks: `acts [n, T, D]` (float32 / float16 / bfloat16),
`token_ids [n, T]`, `positions [n, T]`, `doc_ids [n, T]` and `block_index [n]`. The
manifest lists the shards in order with their sha256 and carries a `complete` flag.
A writer re-opened on an unfinished cache keeps the verified prefix of shards and
continues from there.

Shard `k` always holds blocks `k * shard_blocks ...` and is named `shard-<k>`, whoever
writes it. Several writers (torchrun ranks) can fill one cache: writer `r` of `R` owns
shards `r, r + R, r + 2R, ...`, records its progress in its own
`manifest-rank-<r>-of-<R>.json`, and `merge_ranks` (rank 0, once every rank finished)
joins them into `manifest.json`. On resume a writer takes its verified shards from every
record there is (manifest.json and any rank's), so a cache interrupted under one number
of ranks resumes under another.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.store.atomic import atomic_path, atomic_write_json, read_json, sha256_file
from sae_atlas.store.dtypes import dtype_name, parse_dtype
from sae_atlas.store.layout import AtlasLayout, created_with
from sae_atlas.store.safetensors_io import MappedSafetensors, save_deterministic

MANIFEST_FORMAT = "sae-atlas-activations"
MANIFEST_VERSION = 1
HELDOUT_FRACTION = 0.1
RANK_MANIFESTS = "manifest-rank-*.json"
SETTINGS = ("model", "hook", "d", "dtype", "context_size", "bos_token_id", "prepend_bos", "shard_blocks")
Split = Literal["train", "heldout", "all"]


def _repair(root: Path) -> str:
    return f"re-run `sae-atlas cache {root}` (it resumes from the last good shard)"


def heldout_start(n_blocks: int) -> int:
    """Index of the first held-out block: the last 10% of blocks, at least one."""
    if n_blocks < 2:
        return n_blocks
    return n_blocks - max(1, round(n_blocks * HELDOUT_FRACTION))


def excluded_positions(token_ids: torch.Tensor, positions: torch.Tensor, *, prepend_bos: bool,
                       special_ids: list[int | None]) -> torch.Tensor:
    """Positions to leave out: BOS (position 0 when prepended) and special tokens.

    Special tokens such as the EOS separators between documents carry activations as
    outsized as BOS's, so they are excluded with it (as SAELens' exclude_special_tokens).
    """
    mask = torch.zeros_like(token_ids, dtype=torch.bool)
    if prepend_bos:
        mask |= positions == 0
    special = sorted({i for i in special_ids if i is not None})
    if special:
        mask |= torch.isin(token_ids, torch.tensor(special, device=token_ids.device))
    return mask


@dataclass
class Blocks:
    """Whole blocks read from one shard."""

    acts: torch.Tensor  # [n, T, D] float32
    token_ids: torch.Tensor  # [n, T] int64
    positions: torch.Tensor  # [n, T] int64
    doc_ids: torch.Tensor  # [n, T] int64
    block_index: torch.Tensor  # [n] int64, global block numbers
    is_bos: torch.Tensor  # [n, T] bool: BOS and special (separator) positions


@dataclass
class TokenRows:
    """Token rows of consecutive blocks, flattened (BOS / special positions left out if asked)."""

    acts: torch.Tensor  # [n, D] float32
    token_ids: torch.Tensor  # [n] int64
    positions: torch.Tensor  # [n] int64, position within the block


def shard_index(name: str) -> int | None:
    """The shard number in a shard (or temporary shard) file name."""
    match = re.search(r"shard-(\d+)", name)
    return int(match.group(1)) if match else None


class ActivationWriter:
    """Streams blocks of activations for one hook into shards, resuming an unfinished cache.

    With `world_size` > 1 it writes only the shards of `rank` (see the module docstring);
    `total_blocks`, when known, lets a resume reject a shorter final shard of another run.
    """

    def __init__(
        self,
        root: str | Path,
        hook: str,
        *,
        d: int,
        dtype: str = "float32",
        model: str = "",
        context_size: int,
        bos_token_id: int | None = None,
        prepend_bos: bool = True,
        shard_blocks: int = 64,
        special_token_ids: list[int] | None = None,
        extra: dict[str, Any] | None = None,
        rank: int = 0,
        world_size: int = 1,
        total_blocks: int | None = None,
    ) -> None:
        self.layout = AtlasLayout(root)
        self.dir = self.layout.activation_dir(hook)
        self.torch_dtype = parse_dtype(dtype, kind="activation dtype")
        if shard_blocks <= 0 or context_size <= 0 or d <= 0:
            raise InvalidInputError("d, context_size and shard_blocks must be positive")
        if not 0 <= rank < world_size:
            raise InvalidInputError(f"rank {rank} is not one of {world_size} ranks")
        self.rank, self.world_size, self.total_blocks = rank, world_size, total_blocks
        self.shard_blocks = shard_blocks
        self.manifest_path = self.dir / "manifest.json"
        self.progress_path = self.manifest_path if world_size == 1 else self.rank_manifest(rank)
        fresh = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "model": model,
            "hook": hook,
            "d": d,
            "dtype": dtype_name(dtype),
            "context_size": context_size,
            "bos_token_id": bos_token_id,
            "prepend_bos": prepend_bos,
            "special_token_ids": sorted(set(special_token_ids or [])),
            "shard_blocks": shard_blocks,
            "heldout_fraction": HELDOUT_FRACTION,
            "extra": extra or {},
            "shards": [],
            "n_blocks": 0,
            "n_tokens": 0,
            "complete": False,
        }
        self.manifest = self._resume_or_start(fresh)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._pending_blocks = 0

    def rank_manifest(self, rank: int) -> Path:
        """The progress record of `rank` in a run of `world_size` ranks."""
        return self.dir / f"manifest-rank-{rank:04d}-of-{self.world_size:04d}.json"

    # resume ----------------------------------------------------------------------------
    def _records(self, fresh: dict[str, Any]) -> list[dict[str, Any]]:
        """manifest.json (first, when present) and every rank's progress record, checked
        against the requested settings."""
        paths = [self.manifest_path] if self.manifest_path.exists() else []
        records = []
        for path in paths + sorted(self.dir.glob(RANK_MANIFESTS)):
            old = read_json(path, _repair(self.layout.root))
            changed = [k for k in SETTINGS if old.get(k) != fresh[k]]
            if changed:
                details = ", ".join(f"{k}: cached {old.get(k)!r} vs requested {fresh[k]!r}" for k in changed)
                raise InvalidInputError(
                    f"{path} was written with different settings ({details}); "
                    "use another atlas directory or delete this hook's activations"
                )
            records.append(old)
        return records

    def _resume_or_start(self, fresh: dict[str, Any]) -> dict[str, Any]:
        self.dir.mkdir(parents=True, exist_ok=True)
        records = self._records(fresh)
        main = records[0] if self.manifest_path.exists() else None
        if main is not None and main["complete"]:
            good = self._verified_prefix(main["shards"], owned_only=False)
            if len(good) == len(main["shards"]):
                self._remove_strays({s["file"] for s in good})
                return main
        known = {s["first_block"]: s for record in records for s in record["shards"]}
        mine = [known.get(k * self.shard_blocks)
                for k in range(self.rank, self.rank + len(known) * self.world_size, self.world_size)]
        good = self._verified_prefix(mine, owned_only=True)
        state = {**(main or fresh), "shards": good, "extra": fresh["extra"] or (main or fresh).get("extra", {}),
                 "complete": False}
        self._recount(state)
        self._remove_strays({s["file"] for s in good})
        return state

    def _verified_prefix(self, shards: list[dict[str, Any] | None], *, owned_only: bool) -> list[dict[str, Any]]:
        """The leading shards that exist with the recorded sha256 (and, when the total is
        known and only this writer's shards are looked at, the block count they must have)."""
        good = []
        for shard in shards:
            if shard is None:
                break
            path = self.dir / shard["file"]
            if owned_only and self.total_blocks is not None:
                size = min(self.shard_blocks, self.total_blocks - shard["first_block"])
                if shard["n_blocks"] != size:
                    break
            if not path.exists() or sha256_file(path) != shard["sha256"]:
                break
            good.append(shard)
        return good

    def _remove_strays(self, keep: set[str]) -> None:
        """Delete this writer's shard files (and their temporaries) that no record keeps."""
        for path in self.dir.glob("*shard-*"):
            index = shard_index(path.name)
            owner = 0 if index is None else index % self.world_size
            if owner == self.rank and path.name not in keep:
                path.unlink(missing_ok=True)
        records = {self.progress_path.name} | ({self.manifest_path.name} if self.rank == 0 else set())
        for name in records:  # the temporaries of a record write killed before its rename
            for path in self.dir.glob(f".{name}.*.tmp"):
                path.unlink(missing_ok=True)

    @staticmethod
    def _recount(manifest: dict[str, Any]) -> None:
        manifest["n_blocks"] = sum(s["n_blocks"] for s in manifest["shards"])
        manifest["n_tokens"] = manifest["n_blocks"] * manifest["context_size"]

    @property
    def n_blocks_done(self) -> int:
        """Blocks durably written (and verified) so far."""
        return self.manifest["n_blocks"]

    @property
    def complete(self) -> bool:
        return bool(self.manifest["complete"])

    def truncate_to(self, n_blocks: int) -> None:
        """Drop whole shards beyond `n_blocks` (used to bring several hooks into step)."""
        kept, total = [], 0
        for shard in self.manifest["shards"]:
            if total + shard["n_blocks"] > n_blocks:
                break
            kept.append(shard)
            total += shard["n_blocks"]
        if total != n_blocks:
            raise InvalidInputError(f"cannot truncate to {n_blocks} blocks: not a shard boundary")
        self.manifest["shards"] = kept
        self.manifest["complete"] = False
        self._recount(self.manifest)
        self._write_manifest()
        self._remove_strays({s["file"] for s in kept})

    # writing ---------------------------------------------------------------------------
    def append(self, acts_NTD: torch.Tensor, token_ids_NT: torch.Tensor, doc_ids: torch.Tensor) -> None:
        """Add whole blocks; full shards are written to disk as they fill."""
        if self.complete:
            raise InvalidInputError(f"{self.manifest_path}: cache is already complete")
        m = self.manifest
        n, t = token_ids_NT.shape
        if acts_NTD.shape != (n, t, m["d"]) or t != m["context_size"]:
            raise InvalidInputError(
                f"expected activations [n, {m['context_size']}, {m['d']}] and token ids "
                f"[n, {m['context_size']}], got {tuple(acts_NTD.shape)} and {tuple(token_ids_NT.shape)}"
            )
        if doc_ids.dim() == 1:
            doc_ids = doc_ids[:, None].expand(n, t)
        self._pending.append(
            (acts_NTD.detach().to("cpu", self.torch_dtype), token_ids_NT.cpu().long(), doc_ids.cpu().long())
        )
        self._pending_blocks += n
        while self._pending_blocks >= m["shard_blocks"]:
            self._flush(m["shard_blocks"])

    def _flush(self, n_blocks: int) -> None:
        acts = torch.cat([p[0] for p in self._pending])
        toks = torch.cat([p[1] for p in self._pending])
        docs = torch.cat([p[2] for p in self._pending])
        rest = (acts[n_blocks:], toks[n_blocks:], docs[n_blocks:])
        self._pending = [rest] if len(rest[1]) else []
        self._pending_blocks = len(rest[1])
        self._write_shard(acts[:n_blocks], toks[:n_blocks], docs[:n_blocks])

    def _write_shard(self, acts: torch.Tensor, toks: torch.Tensor, docs: torch.Tensor) -> None:
        m = self.manifest
        index = self.rank + len(m["shards"]) * self.world_size
        first = index * m["shard_blocks"]
        n, t = toks.shape
        name = f"shard-{index:05d}.safetensors"
        tensors = {
            "acts": acts.contiguous(),
            "token_ids": toks.to(torch.int32).contiguous(),
            "positions": torch.arange(t, dtype=torch.int32).expand(n, t).contiguous(),
            "doc_ids": docs.contiguous(),
            "block_index": torch.arange(first, first + n, dtype=torch.int64),
        }
        path = self.dir / name
        with atomic_path(path) as tmp:
            save_deterministic(tensors, tmp, {"hook": m["hook"], "first_block": str(first)})
        m["shards"].append(
            {"file": name, "first_block": first, "n_blocks": n, "sha256": sha256_file(path)}
        )
        self._recount(m)
        self._write_manifest()

    def _write_manifest(self) -> None:
        self.manifest["created_with"] = created_with()
        atomic_write_json(self.progress_path, self.manifest)

    def finish(self) -> None:
        """Write the last partial shard and mark the cache complete (one writer), or record
        this rank's finished part for `merge_ranks` (several)."""
        if self._pending_blocks:
            self._flush(self._pending_blocks)
        if self.world_size > 1:
            self._write_manifest()
            return
        self._complete(self.manifest["shards"])

    def merge_ranks(self) -> None:
        """Join the finished records of all `world_size` ranks into manifest.json, marked
        complete (called once, by rank 0, after every rank's `finish`)."""
        shards = []
        for rank in range(self.world_size):
            path = self.rank_manifest(rank)
            if not path.exists():
                raise IntegrityError(path, f"rank {rank} left no record of its shards", _repair(self.layout.root))
            shards += read_json(path, _repair(self.layout.root))["shards"]
        shards.sort(key=lambda s: s["first_block"])
        expected = 0
        for shard in shards:
            if shard["first_block"] != expected:
                raise IntegrityError(self.dir / shard["file"], f"starts at block {shard['first_block']}, "
                                     f"not {expected}: the ranks' shards leave a gap", _repair(self.layout.root))
            expected += shard["n_blocks"]
        self._complete(shards)

    def _complete(self, shards: list[dict[str, Any]]) -> None:
        self.manifest = {**self.manifest, "shards": shards, "complete": True}
        self._recount(self.manifest)
        if self.manifest["n_blocks"] == 0:
            raise InvalidInputError(f"no blocks were written for hook {self.manifest['hook']!r}")
        self.manifest["created_with"] = created_with()
        atomic_write_json(self.manifest_path, self.manifest)
        for path in self.dir.glob(RANK_MANIFESTS):
            path.unlink(missing_ok=True)


class ActivationReader:
    """Memory-mapped access to a hook's cache: whole blocks in order, or shuffled token batches."""

    def __init__(self, root: str | Path, hook: str, *, allow_incomplete: bool = False) -> None:
        self.layout = AtlasLayout(root)
        self.dir = self.layout.activation_dir(hook)
        path = self.dir / "manifest.json"
        self.repair = _repair(self.layout.root)
        if not path.exists():
            if self.dir.is_dir() or hook in self.layout.recorded_hooks():
                raise IntegrityError(path, f"the activation manifest of hook {hook!r} is missing (its cache "
                                     "cannot be read without it)", self.repair)
            cached = ", ".join(self.layout.cached_hooks()) or "(none)"
            raise NotFoundError(f"hook {hook!r} is not cached in {self.layout.root}; cached: {cached}")
        self.manifest: dict[str, Any] = read_json(path, self.repair)
        if self.manifest.get("format") != MANIFEST_FORMAT:
            raise IntegrityError(path, "not an activation manifest", self.repair)
        if not self.manifest["complete"] and not allow_incomplete:
            raise IntegrityError(path, "the cache is incomplete (interrupted run)", self.repair)
        for shard in self.manifest["shards"]:
            MappedSafetensors(self.dir / shard["file"], self.repair)  # existence + truncation
        self._verified: set[str] = set()

    hook = property(lambda self: self.manifest["hook"])
    model = property(lambda self: self.manifest["model"])
    d = property(lambda self: self.manifest["d"])
    dtype = property(lambda self: self.manifest["dtype"])
    context_size = property(lambda self: self.manifest["context_size"])
    n_blocks = property(lambda self: self.manifest["n_blocks"])
    n_tokens = property(lambda self: self.manifest["n_tokens"])

    def split_range(self, split: Split) -> tuple[int, int]:
        """Global block range [start, stop) of a split."""
        cut = heldout_start(self.n_blocks)
        ranges = {"all": (0, self.n_blocks), "train": (0, cut), "heldout": (cut, self.n_blocks)}
        if split not in ranges:
            raise InvalidInputError(f"unknown split {split!r}; valid: train, heldout, all")
        start, stop = ranges[split]
        if stop <= start:
            raise InvalidInputError(
                f"split {split!r} of hook {self.hook!r} is empty ({self.n_blocks} blocks cached; "
                "cache more tokens)"
            )
        return start, stop

    def verify(self) -> None:
        """Check every shard's sha256 against the manifest (IntegrityError on mismatch)."""
        for shard in self.manifest["shards"]:
            self._open(shard)

    def _open(self, shard: dict[str, Any]) -> MappedSafetensors:
        path = self.dir / shard["file"]
        if shard["file"] not in self._verified:
            if sha256_file(path) != shard["sha256"]:
                raise IntegrityError(path, "sha256 does not match the manifest (corrupt shard)", self.repair)
            self._verified.add(shard["file"])
        return MappedSafetensors(path, self.repair)

    def _shards_in(self, start: int, stop: int) -> list[tuple[dict[str, Any], np.ndarray]]:
        """Shards overlapping [start, stop) with the local row indices inside the range."""
        out = []
        for shard in self.manifest["shards"]:
            lo = max(start, shard["first_block"])
            hi = min(stop, shard["first_block"] + shard["n_blocks"])
            if lo < hi:
                out.append((shard, np.arange(lo - shard["first_block"], hi - shard["first_block"])))
        return out

    def _bos_mask(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        m = self.manifest
        return excluded_positions(token_ids, positions, prepend_bos=m["prepend_bos"],
                                  special_ids=[*m.get("special_token_ids", []), m["bos_token_id"]])

    def blocks(self, split: Split = "all") -> Iterator[Blocks]:
        """Whole blocks of a split, in order, one shard at a time."""
        start, stop = self.split_range(split)
        for shard, rows in self._shards_in(start, stop):
            st = self._open(shard)
            sl = slice(int(rows[0]), int(rows[-1]) + 1)
            toks = st.torch("token_ids", sl).long()
            pos = st.torch("positions", sl).long()
            yield Blocks(
                acts=st.torch("acts", sl).float(),
                token_ids=toks,
                positions=pos,
                doc_ids=st.torch("doc_ids", sl).long(),
                block_index=st.torch("block_index", sl).long(),
                is_bos=self._bos_mask(toks, pos),
            )

    def rows(self, split: Split = "all", *, max_tokens: int | None = None,
             exclude_bos: bool = True) -> Iterator[TokenRows]:
        """The token rows of a split in cache order, one shard at a time, at most
        `max_tokens` of them (all when None); BOS and special positions left out by default."""
        if max_tokens is not None and max_tokens <= 0:
            raise InvalidInputError(f"max_tokens must be positive, got {max_tokens}")
        left = max_tokens
        for blocks in self.blocks(split):
            keep = ~blocks.is_bos.reshape(-1) if exclude_bos else slice(None)
            out = TokenRows(blocks.acts.reshape(-1, self.d)[keep], blocks.token_ids.reshape(-1)[keep],
                            blocks.positions.reshape(-1)[keep])
            if left is not None:
                out = TokenRows(out.acts[:left], out.token_ids[:left], out.positions[:left])
                left -= len(out.token_ids)
            yield out
            if left == 0:
                return

    def count_tokens(self, split: Split = "all", exclude_bos: bool = True) -> int:
        """Number of token rows `batches` would draw from a split in one pass."""
        start, stop = self.split_range(split)
        total = 0
        for shard, rows in self._shards_in(start, stop):
            st = MappedSafetensors(self.dir / shard["file"], self.repair)
            sl = slice(int(rows[0]), int(rows[-1]) + 1)
            toks = torch.from_numpy(np.array(st.numpy("token_ids")[sl])).long()
            pos = torch.from_numpy(np.array(st.numpy("positions")[sl])).long()
            keep = ~self._bos_mask(toks, pos) if exclude_bos else torch.ones_like(toks, dtype=torch.bool)
            total += int(keep.sum())
        return total

    def _token_rows(self, shard: dict[str, Any], rows: np.ndarray, exclude_bos: bool) -> torch.Tensor:
        st = self._open(shard)
        sl = slice(int(rows[0]), int(rows[-1]) + 1)
        acts = st.torch("acts", sl).float().reshape(-1, self.d)
        if not exclude_bos:
            return acts
        toks = st.torch("token_ids", sl).long()
        pos = st.torch("positions", sl).long()
        return acts[~self._bos_mask(toks, pos).reshape(-1)]

    def batches(
        self,
        batch_size: int,
        *,
        seed: int = 0,
        split: Split = "train",
        exclude_bos: bool = True,
        buffer_tokens: int = 262144,
        skip_batches: int = 0,
        repeat: bool = False,
    ) -> Iterator[torch.Tensor]:
        """Seeded shuffled token batches `[batch_size, d]` through a bounded mixing buffer.

        Shards are visited in a seeded order; token rows fill a buffer of at most
        `buffer_tokens + shard size` rows, which is permuted and half emitted before
        refilling. One pass over the split (a final partial batch is dropped); with
        `repeat=True` passes continue forever, pass `e` seeded with `seed + e`.
        `skip_batches` discards that many batches first, so a resumed consumer sees the
        same stream as an uninterrupted one.
        """
        if batch_size <= 0 or buffer_tokens < batch_size:
            raise InvalidInputError("need 0 < batch_size <= buffer_tokens")
        start, stop = self.split_range(split)
        emitted = 0
        epoch = 0
        while True:
            for batch in self._one_pass(start, stop, batch_size, seed + epoch, exclude_bos, buffer_tokens):
                if emitted >= skip_batches:
                    yield batch
                emitted += 1
            epoch += 1
            if not repeat:
                return

    def _one_pass(
        self, start: int, stop: int, batch_size: int, seed: int, exclude_bos: bool, buffer_tokens: int
    ) -> Iterator[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        pieces = self._shards_in(start, stop)
        order = torch.randperm(len(pieces), generator=gen).tolist()
        buffer = torch.empty(0, self.d)
        for i in order:
            shard, rows = pieces[i]
            buffer = torch.cat([buffer, self._token_rows(shard, rows, exclude_bos)])
            if len(buffer) < buffer_tokens:
                continue
            buffer = buffer[torch.randperm(len(buffer), generator=gen)]
            n_out = (len(buffer) // 2 // batch_size) * batch_size
            if n_out:  # `split` of zero rows would yield one empty batch
                yield from buffer[:n_out].split(batch_size)
            buffer = buffer[n_out:]
        buffer = buffer[torch.randperm(len(buffer), generator=gen)]
        n_out = (len(buffer) // batch_size) * batch_size
        if n_out:
            yield from buffer[:n_out].split(batch_size)

