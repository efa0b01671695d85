"""Atomic file writes (temporary file, fsync, rename; PNG figures too), the versions they
give a file, and checksums."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync it and rename it into place.

    The caller writes the file at the yielded path by any means (safetensors, polars,
    FAISS). If the block raises, the temporary file is removed and `path` is untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def remove_temporaries(path: str | os.PathLike[str]) -> None:
    """Delete the temporaries `atomic_path` left beside `path` when a write of it was killed
    before its rename; only for a writer that is the file's one writer at the time."""
    target = Path(path)
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        stale.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def save_png(fig: Figure, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Write `fig` as a PNG atomically (first removing what a killed write of it left) and
    return the path."""
    remove_temporaries(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    return Path(path)


def file_version(path: str | os.PathLike[str]) -> str:
    """The version of a file that is replaced atomically when rewritten (a new inode and
    modification time each time); "none" when it does not exist."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return "none"
    return f"{stat.st_ino}:{stat.st_mtime_ns}"


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Return the hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: str | os.PathLike[str], repair: str) -> Any:
    """Read a JSON file, raising IntegrityError (with `repair` advice) if missing or corrupt."""
    from sae_atlas.errors import IntegrityError

    p = Path(path)
    if not p.exists():
        raise IntegrityError(p, "file is missing", repair)
    try:
        return json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IntegrityError(p, f"not valid JSON ({exc})", repair) from exc
