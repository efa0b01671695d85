"""HTTP service under load: 32 concurrent clients on loopback for a bounded time.

Starts `sae-atlas serve` in a subprocess over an atlas (default: the small test atlas,
built into a temporary folder), then for each of three requests -- feature lookup,
similar-feature search, text search -- runs N concurrent asyncio clients for `--seconds`
(closed loop, no think time, one keep-alive connection each) and reports p50 / p99 latency
and throughput. The clients speak HTTP/1.1 directly over asyncio streams (uvloop when
installed) so that the load generator, which shares the machine's cores with the server,
costs little CPU per request. The baseline, measured in this process first, is the same
call on an in-process, preloaded `Atlas` with the same JSON encoding (no HTTP); the ratio p50(HTTP) / in-process mean shows the
service overhead.

    PYTHONPATH=. python bench/api_load.py [--atlas DIR] [--clients 32] [--seconds 10] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sae_atlas import Atlas  # noqa: E402
from sae_atlas.api.http.json_body import dumps  # noqa: E402

TEXT = "the cat sat on the mat on monday and the dog ran to the house"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Connection:
    """One keep-alive HTTP/1.1 connection: request -> (status, body)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
                "Content-Type: application/json\r\n\r\n").encode()
        self.writer.write(head + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if "content-length" not in headers:
            raise RuntimeError(f"{target}: response without Content-Length")
        payload = await self.reader.readexactly(int(headers["content-length"]))
        return int(lines[0].split()[1]), payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _requests(atlas: Atlas) -> dict[str, tuple[Any, Any]]:
    """name -> (request(rng) -> (method, target, body), in-process call(rng))."""
    sae_ids = atlas.sae_ids
    d_sae = {s: int(atlas.sae_info(s)["d_sae"]) for s in sae_ids}
    text_body = orjson.dumps({"text": TEXT, "k": 5})

    def pick(rng: random.Random) -> tuple[str, int]:
        sae = rng.choice(sae_ids)
        return sae, rng.randrange(d_sae[sae])

    def http_feature(rng: random.Random) -> tuple[str, str, bytes]:
        sae, i = pick(rng)
        return "GET", f"/saes/{sae}/features/{i}", b""

    def http_similar(rng: random.Random) -> tuple[str, str, bytes]:
        sae, i = pick(rng)
        return "GET", f"/saes/{sae}/features/{i}/similar?k=10", b""

    def http_text(rng: random.Random) -> tuple[str, str, bytes]:
        return "POST", "/search/text", text_body

    return {
        "feature lookup": (http_feature, lambda rng: dumps(atlas.feature(*pick(rng)))),
        "similar search (k=10)": (http_similar, lambda rng: dumps(atlas.similar(*pick(rng), k=10).to_dicts())),
        "text search": (http_text, lambda rng: dumps(atlas.search_text(TEXT, k=5))),
    }


def in_process_ms(call: Any, n: int) -> float:
    """Mean milliseconds of `call` on an in-process Atlas (after one warm-up)."""
    rng = random.Random(0)
    call(rng)
    started = time.perf_counter()
    for _ in range(n):
        call(rng)
    return (time.perf_counter() - started) / n * 1000


async def _client_loop(host: str, port: int, make: Any, seed: int, stop_at: float,
                       latencies: list[float], errors: list[int], workers: list[int]) -> None:
    rng = random.Random(seed)
    connection = Connection(host, port)
    _, health = await connection.request("GET", "/health")
    workers.append(orjson.loads(health)["worker_pid"])
    try:
        while time.perf_counter() < stop_at:
            method, target, body = make(rng)
            started = time.perf_counter()
            status, _ = await connection.request(method, target, body)
            latencies.append((time.perf_counter() - started) * 1000)
            if status != 200:
                errors.append(status)
    finally:
        connection.close()


async def load(url: str, make: Any, clients: int, seconds: float) -> dict[str, float]:
    """Run `clients` concurrent loops of `make` for `seconds`; latency percentiles (ms), req/s."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors: list[int] = []
    workers: list[int] = []
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(_client_loop(host, int(port), make, seed, stop_at, latencies, errors, workers)
                           for seed in range(clients)))
    elapsed = time.perf_counter() - started
    lat = np.array(latencies)
    return {"requests": len(lat), "errors": len(errors), "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "rps": len(lat) / elapsed,
            "per_worker": sorted(Counter(workers).values(), reverse=True)}


def run(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def start_server(root: Path, workers: int) -> tuple[subprocess.Popen, str]:
    """`python -m sae_atlas serve ROOT` on a free loopback port; waits until /health has been
    answered by every worker (each answers once it has preloaded the atlas)."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "sae_atlas", "serve", str(root), "--port", str(port),
                             "--workers", str(workers), "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    seen: set[int] = set()
    while time.monotonic() < deadline and len(seen) < workers:
        try:
            seen.add(httpx.get(url + "/health", timeout=2).json()["worker_pid"])  # a new connection each time
        except httpx.HTTPError:
            time.sleep(0.2)
    if len(seen) < workers:
        proc.kill()
        raise RuntimeError(f"server did not start ({len(seen)} of {workers} workers answered)")
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atlas", type=Path, help="atlas directory (default: build the small test atlas)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--skip-text", action="store_true", help="skip the text search (model-bound)")
    args = parser.parse_args()
    root = args.atlas
    if root is None:
        from tests.api.small_atlas import build_small_atlas

        root = Path(tempfile.mkdtemp(prefix="sae-atlas-bench-")) / "small"
        print(f"building the small test atlas in {root} ...", flush=True)
        build_small_atlas(root)
    atlas = Atlas(root)
    atlas.preload()
    requests = _requests(atlas)
    if args.skip_text:
        requests.pop("text search")
    baseline = {name: in_process_ms(call, 20 if name == "text search" else 200)
                for name, (_, call) in requests.items()}
    proc, url = start_server(root, args.workers)
    try:
        print(f"atlas {root}: {len(atlas.sae_ids)} SAEs; {args.clients} clients x {args.seconds:.0f} s each; "
              f"{args.workers} worker(s)")
        print("| request | requests | errors | p50 ms | p99 ms | req/s | in-process ms | p50 / in-process "
              "| connections per worker |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, (make, _) in requests.items():
            run(load(url, make, 8, 1.0))  # warm up connections and allocators
            r = run(load(url, make, args.clients, args.seconds))
            print(f"| {name} | {r['requests']} | {r['errors']} | {r['p50']:.1f} | {r['p99']:.1f} | "
                  f"{r['rps']:.0f} | {baseline[name]:.2f} | {r['p50'] / baseline[name]:.1f}x | "
                  f"{'/'.join(map(str, r['per_worker']))} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
