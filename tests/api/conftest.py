"""Fixtures of the API tests: one small atlas per session and a live server on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.small_atlas import build_small_atlas

TOKEN = "test-token-123"


@pytest.fixture(scope="session")
def small_atlas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The small atlas (tiny model, 2 SAEs, summaries, maps, one planted analysis)."""
    return build_small_atlas(tmp_path_factory.mktemp("atlas") / "small")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """uvicorn serving `create_app(settings)` in a background thread on a free loopback port."""

    def __init__(self, root: Path, **settings: Any) -> None:
        import uvicorn

        from sae_atlas.api.http import ServerSettings, create_app
        from sae_atlas.api.http.protocol import JsonErrorsProtocol

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(ServerSettings(root=root, **settings)), host="127.0.0.1", http=JsonErrorsProtocol,
                                port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("the test server did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def server(small_atlas: dict[str, Any]) -> Iterator[LiveServer]:
    """An open (no token) read-only server over the small atlas."""
    with LiveServer(small_atlas["root"]) as live:
        yield live


@pytest.fixture(scope="session")
def token_server(small_atlas: dict[str, Any]) -> Iterator[LiveServer]:
    """A server that requires the bearer token TOKEN and allows analyses."""
    with LiveServer(small_atlas["root"], token=TOKEN, allow_analyses=True) as live:
        yield live
