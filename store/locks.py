"""Advisory file locks (Linux `fcntl.flock`) between the processes that rewrite parts of an
atlas and those that read them, e.g. a running server.

A writer holds a lock file exclusively while it replaces a group of files that belong
together; a reader holds it shared while it reads them, so it sees the group whole, old or
new. A reader that must not block (a server answering from what it read before) asks with
`wait=0` and keeps its copy when a writer holds the lock. Locks are re-entrant within a
thread: a writer holding a lock may call readers (and writers) that take it again. A killed
process releases its locks; on a read-only atlas without the lock file there is no writer
to wait for.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

LockMode = Literal["shared", "exclusive"]
TABLES_LOCK_FILE = ".tables.lock"
_POLL_SECONDS = 0.02
_held = threading.local()  # `locks`: absolute lock path -> mode held by this thread


def _held_here() -> dict[str, LockMode]:
    if not hasattr(_held, "locks"):
        _held.locks = {}
    return _held.locks


def _open(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        try:
            return os.open(path, os.O_RDONLY)
        except OSError:
            return None


def _acquire(fd: int, mode: LockMode, wait: float | None) -> bool:
    operation = fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH
    if wait is None:
        fcntl.flock(fd, operation)
        return True
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(_POLL_SECONDS, left))


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], mode: LockMode, *, wait: float | None = None) -> Iterator[bool]:
    """Hold an flock on the lock file `path` (created when missing) for the block; yields
    True once held. With `wait` seconds (0: do not wait) it yields False instead when
    another process holds a conflicting lock that long. A lock this thread already holds is
    held again at once (a shared one cannot become exclusive: RuntimeError)."""
    key = os.path.abspath(path)
    held = _held_here()
    if key in held:
        if mode == "exclusive" and held[key] == "shared":
            raise RuntimeError(f"{path}: this thread holds the lock shared and cannot take it exclusively")
        yield True
        return
    fd = _open(Path(path))
    if fd is None:
        yield True
        return
    try:
        if not _acquire(fd, mode, wait):
            yield False
            return
        held[key] = mode
        try:
            yield True
        finally:
            del held[key]
    finally:
        os.close(fd)  # releases the lock


def tables_lock(folder: Path, mode: LockMode, *, wait: float | None = None) -> contextlib.AbstractContextManager[bool]:
    """The lock of an SAE folder's summary: its tables, their sidecar and its labels table,
    written together (`store.tables.write_tables`, `store.feature_records.update_labels`)."""
    return file_lock(folder / TABLES_LOCK_FILE, mode, wait=wait)
