"""HTTP service under load: 32 concurrent clients on loopback for a bounded time.

Starts `sae-atlas serve` in a subprocess over an atlas (default: the small test atlas,
built into a temporary folder), then for each of three requests -- feature lookup,
similar-feature search, text search -- runs N concurrent asyncio clients (httpx, one
connection each) for `--seconds` and reports p50 / p99 latency and throughput. The
baseline, measured in this process first, is the same call on an in-process `Atlas`
(no HTTP); the ratio p50(HTTP) / in-process mean shows the service overhead.

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
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api import Atlas  # noqa: E402

TEXT = "the cat sat on the mat on monday and the dog ran to the house"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _requests(atlas: Atlas) -> dict[str, tuple[Any, Any]]:
    """name -> (make HTTP request(client, rng), in-process call(rng))."""
    sae_ids = atlas.sae_ids
    d_sae = {s: int(atlas.sae_info(s)["d_sae"]) for s in sae_ids}

    def pick(rng: random.Random) -> tuple[str, int]:
        sae = rng.choice(sae_ids)
        return sae, rng.randrange(d_sae[sae])

    def http_feature(client: httpx.AsyncClient, rng: random.Random) -> Any:
        sae, i = pick(rng)
        return client.get(f"/saes/{sae}/features/{i}")

    def http_similar(client: httpx.AsyncClient, rng: random.Random) -> Any:
        sae, i = pick(rng)
        return client.get(f"/saes/{sae}/features/{i}/similar", params={"k": 10})

    def http_text(client: httpx.AsyncClient, rng: random.Random) -> Any:
        return client.post("/search/text", json={"text": TEXT, "k": 5})

    return {
        "feature lookup": (http_feature, lambda rng: atlas.feature(*pick(rng)).to_dict()),
        "similar search (k=10)": (http_similar, lambda rng: atlas.similar(*pick(rng), k=10).to_dicts()),
        "text search": (http_text, lambda rng: atlas.search_text(TEXT, k=5).to_dict()),
    }


def in_process_ms(call: Any, n: int) -> float:
    """Mean milliseconds of `call` on an in-process Atlas (after one warm-up)."""
    rng = random.Random(0)
    call(rng)
    started = time.perf_counter()
    for _ in range(n):
        call(rng)
    return (time.perf_counter() - started) / n * 1000


async def _client_loop(url: str, make: Any, seed: int, stop_at: float, latencies: list[float],
                       errors: list[int]) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 limits=httpx.Limits(max_connections=1)) as client:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            response = await make(client, rng)
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                errors.append(response.status_code)


async def load(url: str, make: Any, clients: int, seconds: float) -> dict[str, float]:
    """Run `clients` concurrent loops of `make` for `seconds`; latency percentiles (ms), req/s."""
    latencies: list[float] = []
    errors: list[int] = []
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(_client_loop(url, make, seed, stop_at, latencies, errors) for seed in range(clients)))
    elapsed = time.perf_counter() - started
    lat = np.array(latencies)
    return {"requests": len(lat), "errors": len(errors), "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "rps": len(lat) / elapsed}


def start_server(root: Path, workers: int) -> tuple[subprocess.Popen, str]:
    """`python -m api serve ROOT` on a free loopback port; waits for /health."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "api", "serve", str(root), "--port", str(port),
                             "--workers", str(workers), "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


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
    requests = _requests(atlas)
    if args.skip_text:
        requests.pop("text search")
    baseline = {name: in_process_ms(call, 20 if name == "text search" else 200)
                for name, (_, call) in requests.items()}
    proc, url = start_server(root, args.workers)
    try:
        print(f"atlas {root}: {len(atlas.sae_ids)} SAEs; {args.clients} clients x {args.seconds:.0f} s each; "
              f"{args.workers} worker(s)")
        print("| request | requests | errors | p50 ms | p99 ms | req/s | in-process ms | p50 / in-process |")
        print("|---|---|---|---|---|---|---|---|")
        for name, (make, _) in requests.items():
            asyncio.run(load(url, make, 4, 1.0))  # warm every worker's caches
            r = asyncio.run(load(url, make, args.clients, args.seconds))
            print(f"| {name} | {r['requests']} | {r['errors']} | {r['p50']:.1f} | {r['p99']:.1f} | "
                  f"{r['rps']:.0f} | {baseline[name]:.2f} | {r['p50'] / baseline[name]:.1f}x |", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
