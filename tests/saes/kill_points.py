"""Deterministic kill -9 for resume tests: run a job in a forked child process that
SIGKILLs itself at a named point (the n-th call of a monkeypatched function: before it,
after it, or half-way through the file it writes), like a power cut at exactly that point.

Forking keeps the tiny model and imports of the test process, so a killed run costs
milliseconds instead of a fresh interpreter. The child runs single-threaded (torch's
thread pool is not fork-safe) and never returns into pytest.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

REPO = Path(__file__).resolve().parents[2]
When = Literal["before", "after", "mid_write"]
NOT_KILLED, FAILED = 3, 4  # exit codes of a child that finished or raised instead of dying


@dataclass(frozen=True)
class KillPoint:
    """Die at the `call`-th call of `target` ("module.attr" or "module.Class.attr"): `before`
    it runs, `after` it returns, or `mid_write` (it writes its file, the file is cut to half
    its bytes, then the process dies; `path_arg` is the position of the path argument). With
    `matching` (a glob), only calls whose path argument matches it are counted."""

    target: str
    call: int
    when: When = "before"
    path_arg: int = 1
    matching: str = ""

    def install(self) -> None:
        """Replace the target by its dying version (in this process only)."""
        owner, name = _resolve(self.target)
        real, calls = getattr(owner, name), [0]

        def dying(*args: Any, **kwargs: Any) -> Any:
            if self.matching and not fnmatch.fnmatch(str(args[self.path_arg]), self.matching):
                return real(*args, **kwargs)
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


def run_child_until_killed(job: str, root: Path, point: KillPoint, timeout: float = 300.0) -> None:
    """Run `job` ("module.function", called with `root`) in a fresh interpreter that dies by
    SIGKILL at `point`, for jobs that use polars (its thread pool does not survive a fork);
    fail when it finishes or raises instead."""
    code = ("import json, sys\nimport torch\nfrom tests.saes.kill_points import KillPoint, call_job\n"
            "torch.set_num_threads(1)\nKillPoint(**json.loads(sys.argv[1])).install()\ncall_job(sys.argv[2], sys.argv[3])\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "POLARS_MAX_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(point.__dict__), job, str(root)], cwd=REPO, env=env,
                          timeout=timeout, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, (
        f"the job was not killed at {point}: exit code {done.returncode}\n{done.stderr[-3000:]}")


def call_job(job: str, root: str | Path) -> object:
    """Call the function named `job` ("module.function") with the path `root`."""
    owner, name = _resolve(job)
    return getattr(owner, name)(Path(root))


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


def timeless_tree(root: Path, timed: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """`tree_hashes(root)`, except that each JSON file named in `timed` is its parsed content
    without the dotted keys listed for it: the fields that legitimately differ between two
    runs (wall times, random ids, time stamps, and the checksums of files holding them)."""
    timed = timed or {}
    found: dict[str, Any] = tree_hashes(root, skip=tuple(timed))
    for name, keys in timed.items():
        path = root / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for key in keys:
            *parents, last = key.split(".")
            owner = data
            for part in parents:
                owner = owner[int(part)] if isinstance(owner, list) else owner[part]
            owner.pop(last)
        found[name] = data
    return found


def fresh_copy(base: Path, work: Path) -> Path:
    """`work` as a copy of `base` (replacing what was there); every run of a comparison uses
    one path, so fields that record the atlas' path agree."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    return work


def killed_then_resumed(job: str, base: Path, work: Path, point: KillPoint,
                        timed: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """Run `job` ("module.function" of the atlas path) on a fresh copy of `base` at `work` in
    a child process until it dies at `point`, run it again here to the end, and return the
    resulting `timeless_tree`."""
    fresh_copy(base, work)
    run_child_until_killed(job, work, point)
    call_job(job, work)
    return timeless_tree(work, timed)


def uninterrupted(job: str, base: Path, work: Path, timed: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The `timeless_tree` of one uninterrupted run of `job` on a fresh copy of `base` at `work`."""
    fresh_copy(base, work)
    call_job(job, work)
    return timeless_tree(work, timed)
