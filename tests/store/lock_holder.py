"""A lock held by another thread, as another process would hold it, for tests of readers
and writers that meet it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sae_atlas.store.locks import LockMode, file_lock


@contextmanager
def held_elsewhere(path: Path, mode: LockMode = "exclusive", during: Callable[[], None] = lambda: None) -> Iterator[None]:
    """The lock file `path` held in `mode` by another thread (its own lock, not this
    thread's) for the block; `during()` runs in that thread once the lock is held."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with file_lock(path, mode):
            during()
            taken.set()
            release.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(30), "the other thread did not take the lock"
    try:
        yield
    finally:
        release.set()
        thread.join(30)
