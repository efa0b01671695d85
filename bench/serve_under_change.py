"""HTTP service under load while the atlas's files change: 5xx, latency and old-or-new answers.

Starts `sae-atlas serve` in a subprocess over ATLAS (which it rewrites: pass a copy), picks a
fixed set of probe latents in every SAE and records the server's answer to their feature page
(`GET /saes/{id}/features/{i}`) and similar-feature search (`.../similar?k=10`): the old
state. Then N concurrent clients (closed loop, keep-alive, `bench.api_load.Connection`)
request those targets for `--seconds` twice: idle (the baseline), then while two writers run
in separate processes: `sae-atlas summarize --sae ID --force --no-model --tokens T --seed 1`
(rewrites the summary tables and labels of one SAE, with other figures than before) and
`sae-atlas index --rebuild` (rewrites every index). The change window lasts `--seconds` or
until both writers exit, whichever is later. Afterwards the same server answers every target
once more, and a fresh server on the rewritten atlas gives the new state.

Every answer body is classified against the two states: old, new (old = new counts as both),
or neither; a mixed answer is diagnosed by the top-level fields that match only the old state,
only the new one, or neither. Latency: p50 / p99 idle versus during the change window, and the
ratio p99(change) / p99(idle).

    PYTHONPATH=. python bench/serve_under_change.py --atlas COPY [--seconds 30] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.api_load import Connection, run, start_server  # noqa: E402

Kind = Literal["feature", "similar"]
Phase = Literal["idle", "change"]
State = Literal["old", "new", "old=new", "neither"]
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    """One probed request."""

    kind: Kind
    path: str


@dataclass
class Record:
    """What the clients saw in one phase."""

    started: list[float] = field(default_factory=list)  # perf_counter at send
    latency_ms: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)  # 0: the connection failed
    target: list[Target] = field(default_factory=list)
    digest: list[bytes] = field(default_factory=list)
    bodies: dict[bytes, bytes] = field(default_factory=dict)  # digest -> one body with it

    def add(self, started: float, target: Target, status: int, body: bytes) -> None:
        """One answer, received now, to a request sent at `started`."""
        self.started.append(started)
        self.latency_ms.append((time.perf_counter() - started) * 1000)
        self.status.append(status)
        self.target.append(target)
        self.digest.append(digest := _digest(body))
        self.bodies.setdefault(digest, body)


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


def probe_targets(url: str, per_sae: int, seed: int) -> tuple[list[Target], list[str]]:
    """`per_sae` seeded latents of every SAE, each as a feature page and a similar search; the SAE ids."""
    saes = httpx.get(url + "/saes", timeout=30).json()
    rng = random.Random(seed)
    targets = []
    for sae in saes:
        for latent in sorted(rng.sample(range(int(sae["d_sae"])), per_sae)):
            base = f"/saes/{sae['sae_id']}/features/{latent}"
            targets += [Target("feature", base), Target("similar", base + "/similar?k=10")]
    return targets, [sae["sae_id"] for sae in saes]


def once(url: str, targets: list[Target]) -> Record:
    """Each target requested once, in turn."""
    record = Record()
    with httpx.Client(base_url=url, timeout=60) as client:
        for target in targets:
            started = time.perf_counter()
            response = client.get(target.path)
            record.add(started, target, response.status_code, response.content)
    return record


def answers(url: str, targets: list[Target]) -> dict[Target, bytes]:
    """One answer body per target (a 200 is required: these are the reference states)."""
    record = once(url, targets)
    for target, status, digest in zip(record.target, record.status, record.digest, strict=True):
        if status != 200:
            raise RuntimeError(f"{target.path}: {status} {record.bodies[digest][:300]!r}")
    return {target: record.bodies[digest] for target, digest in zip(record.target, record.digest, strict=True)}


async def _client(host: str, port: int, targets: list[Target], seed: int, done: Callable[[], bool],
                  record: Record) -> None:
    rng = random.Random(seed)
    connection = Connection(host, port)
    try:
        while not done():
            target = rng.choice(targets)
            started = time.perf_counter()
            try:
                status, body = await connection.request("GET", target.path)
            except (OSError, asyncio.IncompleteReadError, RuntimeError):
                connection.close()
                connection = Connection(host, port)
                status, body = 0, b""
            record.add(started, target, status, body)
    finally:
        connection.close()


def until(seconds: float) -> Callable[[], bool]:
    """A `done` test that turns true `seconds` from now."""
    stop_at = time.perf_counter() + seconds
    return lambda: time.perf_counter() >= stop_at


async def load(url: str, targets: list[Target], clients: int, done: Callable[[], bool]) -> Record:
    """`clients` concurrent closed loops over `targets` until `done()`."""
    host, port = url.removeprefix("http://").split(":")
    record = Record()
    await asyncio.gather(*(_client(host, int(port), targets, seed, done, record) for seed in range(clients)))
    return record


@dataclass
class Writer:
    """One background rewrite: its command, process and when it ran (perf_counter)."""

    name: str
    argv: list[str]
    started: float = 0.0
    ended: float | None = None
    returncode: int | None = None
    process: subprocess.Popen | None = None

    def start(self, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "sae_atlas", *self.argv], env=env,
                                            stdout=out, stderr=subprocess.STDOUT)
        self.started = time.perf_counter()

    def poll(self) -> bool:
        """Whether it has exited (recording when)."""
        if self.ended is None and self.process is not None and self.process.poll() is not None:
            self.ended, self.returncode = time.perf_counter(), self.process.returncode
        return self.ended is not None


async def load_while(url: str, targets: list[Target], clients: int, seconds: float,
                     writers: list[Writer], logs: Path) -> Record:
    """Start the writers, then run the clients for `seconds` or until every writer exited."""
    window = until(seconds)
    for writer in writers:
        writer.start(logs / f"{writer.name}.log")

    def done() -> bool:
        return all([w.poll() for w in writers]) and window()

    return await load(url, targets, clients, done)


def classify(body: bytes, old: bytes, new: bytes) -> State:
    if body == old == new:
        return "old=new"
    return "old" if body == old else "new" if body == new else "neither"


def mixed_fields(body: bytes, old: bytes, new: bytes) -> str:
    """Which top-level fields of a mixed answer match only the old state, only the new one, or neither."""
    got, was, becomes = orjson.loads(body), orjson.loads(old), orjson.loads(new)
    if not isinstance(got, dict):
        return "a list that is neither state"
    only_old = [k for k in got if got[k] == was.get(k) != becomes.get(k)]
    only_new = [k for k in got if got[k] == becomes.get(k) != was.get(k)]
    neither = [k for k in got if got[k] not in (was.get(k), becomes.get(k))]
    return f"old: {','.join(only_old) or '-'}; new: {','.join(only_new) or '-'}; neither: {','.join(neither) or '-'}"


def states(record: Record, old: dict[Target, bytes], new: dict[Target, bytes],
           keep: np.ndarray | None = None) -> tuple[Counter, Counter]:
    """Count of answers per (kind, state) among 200s, and the diagnoses of the mixed ones."""
    counts: Counter = Counter()
    mixed: Counter = Counter()
    for i, (target, status, digest) in enumerate(zip(record.target, record.status, record.digest, strict=True)):
        if status != 200 or (keep is not None and not keep[i]):
            continue
        body = record.bodies[digest]
        state = classify(body, old[target], new[target])
        counts[target.kind, state] += 1
        if state == "neither":
            mixed[target.kind, mixed_fields(body, old[target], new[target])] += 1
    return counts, mixed


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    if not len(values):
        return float("nan"), float("nan")
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def _latencies(record: Record, kind: str, mask: np.ndarray | None = None) -> np.ndarray:
    """Latencies (ms) of the requests of `kind` ("all" for every kind), among `mask` when given."""
    chosen = np.array([kind in ("all", t.kind) for t in record.target], dtype=bool)
    return np.asarray(record.latency_ms)[chosen & mask if mask is not None else chosen]


def latency_table(idle: Record, change: Record, writing: np.ndarray) -> None:
    """Per request kind: requests, 5xx, p50 / p99 idle and during the change, and the p99 ratio."""
    print("| request | idle requests | idle p50 ms | idle p99 ms | change requests | change 5xx | change p50 ms "
          "| change p99 ms | p99 while a writer ran | p99(change) / p99(idle) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in ("feature", "similar", "all"):
        i50, i99 = _percentiles(_latencies(idle, kind))
        c50, c99 = _percentiles(_latencies(change, kind))
        w99 = _percentiles(_latencies(change, kind, writing))[1]
        errors = sum(1 for t, s in zip(change.target, change.status, strict=True)
                     if s >= 500 and kind in ("all", t.kind))
        print(f"| {kind} | {len(_latencies(idle, kind))} | {i50:.1f} | {i99:.1f} | {len(_latencies(change, kind))} "
              f"| {errors} | {c50:.1f} | {c99:.1f} | {w99:.1f} | **{c99 / i99:.2f}x** |")


def state_table(rows: dict[str, tuple[Counter, Counter]], targets: list[Target], old: dict[Target, bytes],
                new: dict[Target, bytes]) -> None:
    """Per phase and kind: answers that are the old state, the new one, either, or neither."""
    for kind in ("feature", "similar"):
        changed = sum(old[t] != new[t] for t in targets if t.kind == kind)
        print(f"{kind}: {changed} of {sum(t.kind == kind for t in targets)} probe targets differ between the states")
    print("| phase | request | old | new | old = new | neither (mixed) |")
    print("|---|---|---|---|---|---|")
    for phase, (counts, _) in rows.items():
        for kind in ("feature", "similar"):
            print(f"| {phase} | {kind} | {counts[kind, 'old']} | {counts[kind, 'new']} | {counts[kind, 'old=new']} "
                  f"| {counts[kind, 'neither']} |")
    for phase, (_, mixed) in rows.items():
        for (kind, fields), n in mixed.most_common():
            print(f"mixed {phase} {kind} x{n}: {fields}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atlas", type=Path, required=True, help="atlas directory, rewritten: pass a copy")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the idle and of the change phase")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--sae", help="SAE whose summary is rewritten (default: the first)")
    parser.add_argument("--tokens", type=int, default=4096, help="held-out tokens of the rewritten summary")
    parser.add_argument("--probes", type=int, default=32, help="probe latents per SAE")
    args = parser.parse_args()
    root = args.atlas.resolve()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-under-change-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    proc, url = start_server(root, args.workers)
    writers: list[Writer] = []
    try:
        targets, sae_ids = probe_targets(url, args.probes, seed=0)
        rewritten = args.sae or sae_ids[0]
        writers += [
            Writer("summarize", ["summarize", "--atlas", str(root), "--sae", rewritten, "--force", "--no-model",
                                 "--tokens", str(args.tokens), "--seed", "1"]),
            Writer("index", ["index", "--atlas", str(root), "--rebuild"]),
        ]
        print(f"atlas {root}: {len(sae_ids)} SAEs, {len(targets)} probe targets; {args.clients} clients, "
              f"{args.workers} worker(s); rewriting the summary of {rewritten} and every index", flush=True)
        run(load(url, targets, 8, until(1.0)))  # warm up connections, allocators and the labels
        old = answers(url, targets)
        idle = run(load(url, targets, args.clients, until(args.seconds)))
        change = run(load_while(url, targets, args.clients, args.seconds, writers, logs))
        for writer in writers:
            print(f"{writer.name}: exit {writer.returncode} after {writer.ended - writer.started:.1f} s "
                  f"(log {logs / writer.name}.log)", flush=True)
        after = once(url, targets)
    finally:
        for writer in writers:
            if writer.process is not None and writer.process.poll() is None:
                writer.process.kill()
        proc.terminate()
        proc.wait(timeout=30)
    if any(w.returncode != 0 for w in writers):
        raise SystemExit("a writer failed: see its log")
    fresh, fresh_url = start_server(root, 1)
    try:
        new = answers(fresh_url, targets)
    finally:
        fresh.terminate()
        fresh.wait(timeout=30)

    last_exit = max(w.ended for w in writers if w.ended is not None)
    first_start = min(w.started for w in writers)
    writing = np.array([first_start <= t < last_exit for t in change.started], dtype=bool)
    mix = "; ".join(f"{phase} {dict(Counter(r.status))}" for phase, r in
                    (("idle", idle), ("change", change), ("after", after)))
    print(f"status mix: {mix} (0: the connection failed)")
    latency_table(idle, change, writing)
    state_table({"idle": states(idle, old, new), "change, a writer running": states(change, old, new, writing),
                 "change, writers done": states(change, old, new, ~writing),
                 "same server, each target once after": states(after, old, new)}, targets, old, new)


if __name__ == "__main__":
    main()
