"""`sae-atlas serve --workers 2`: two real worker processes serve one atlas, each with its
own preloaded Atlas, and answer identically."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_two_workers_serve_the_same_atlas(small_atlas: dict[str, Any]) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sae_atlas", "serve", str(small_atlas["root"]), "--port", str(port),
                             "--workers", "2", "--log-level", "warning"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        pids: set[int] = set()
        bodies: dict[int, bytes] = {}
        sae_id = small_atlas["sae_ids"][0]
        deadline = time.monotonic() + 60
        while len(bodies) < 2 and time.monotonic() < deadline:
            try:
                with httpx.Client(base_url=url, timeout=10) as client:  # a new connection each round
                    pid = client.get("/health").json()["worker_pid"]
                    pids.add(pid)
                    bodies[pid] = client.get(f"/saes/{sae_id}/features/3").content
            except httpx.HTTPError:
                time.sleep(0.2)
        assert len(pids) == 2 and proc.pid not in pids  # two worker processes, not the parent
        first, second = bodies.values()
        assert first == second and b'"neighbours"' in first
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_workers_on_a_taken_port_are_a_clear_error(small_atlas: dict[str, Any]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "sae_atlas", "serve", str(small_atlas["root"]), "--port", str(port),
                              "--workers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out.stderr + out.stdout
