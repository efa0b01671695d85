"""Deterministic kill -9 for resume tests: run a job in a forked child process that
SIGKILLs itself at a named point (the n-th call of a monkeypatched function: before it,
after it, or half-way through the file it writes), like a power cut at exactly that point.

Forking keeps the tiny model and imports of the test process, so a killed run costs
milliseconds instead of a fresh interpreter. The child runs single-threaded (torch's
thread pool is not fork-safe) and never returns into pytest.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

When = Literal["before", "after", "mid_write"]
NOT_KILLED, FAILED = 3, 4  # exit codes of a child that finished or raised instead of dying


@dataclass(frozen=True)
class KillPoint:
    """Die at the `call`-th call of `target` ("module.attr" or "module.Class.attr"): `before`
    it runs, `after` it returns, or `mid_write` (it writes its file, the file is cut to half
    its bytes, then the process dies; `path_arg` is the position of the path argument)."""

    target: str
    call: int
    when: When = "before"
    path_arg: int = 1

    def install(self) -> None:
        """Replace the target by its dying version (in this process only)."""
        owner, name = _resolve(self.target)
        real, calls = getattr(owner, name), [0]

        def dying(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] != self.call:
                return real(*args, **kwargs)
            if self.when == "before":
                _sigkill_self()
            result = real(*args, **kwargs)
            if self.when == "mid_write":
                path = Path(args[self.path_arg])
                os.truncate(path, path.stat().st_size // 2)
            _sigkill_self()
            return result

        setattr(owner, name, dying)


def _resolve(target: str) -> tuple[Any, str]:
    """The object holding the attribute named by a dotted path, and the attribute name."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:-1]:
            owner = getattr(owner, attr)
        if not hasattr(owner, parts[-1]):
            raise AttributeError(f"{target}: no attribute {parts[-1]!r}")
        return owner, parts[-1]
    raise ModuleNotFoundError(target)


def _sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run_until_killed(job: Callable[[], object], point: KillPoint, timeout: float = 120.0) -> None:
    """Run `job` in a forked child that dies by SIGKILL at `point`; fail when it finishes,
    raises or hangs instead."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = NOT_KILLED
        try:
            torch.set_num_threads(1)
            point.install()
            job()
        except BaseException:  # noqa: BLE001 - reported through the exit code and stderr
            traceback.print_exc()
            code = FAILED
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the job hung before reaching {point}")
        time.sleep(0.01)
    status = done[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the job was not killed at {point}: exit code {os.waitstatus_to_exitcode(status)} "
        f"({NOT_KILLED}: it finished, {FAILED}: it raised, see stderr)"
    )


def tree_hashes(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under `root` (hidden temporaries included) as {relative path: sha256},
    and every directory as {relative path + '/': 'dir'}; paths in `skip` are left out."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if name in skip:
            continue
        found[name + "/" if path.is_dir() else name] = (
            "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest())
    return found
