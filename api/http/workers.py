"""Several server processes on one port, balanced by the kernel (`SO_REUSEPORT`).

uvicorn's own `--workers` shares one listening socket, and whichever worker wakes first
accepts a burst of connections: 32 clients that connect together often all land on one
worker while the other idles. Here every worker binds its own socket with `SO_REUSEPORT`,
and the kernel spreads new connections across the sockets by a hash of their addresses.
The parent only supervises: it stops every worker when one dies or when it is told to stop.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
from typing import Any

from sae_atlas.errors import InvalidInputError

log = logging.getLogger("sae_atlas.http")


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT, ready for uvicorn."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


def _worker(host: str, port: int, log_level: str) -> None:
    import uvicorn

    from sae_atlas.api.http.protocol import JsonErrorsProtocol

    config = uvicorn.Config("sae_atlas.api.http.app:app_from_env", factory=True, log_level=log_level, http=JsonErrorsProtocol)
    uvicorn.Server(config).run(sockets=[reuseport_socket(host, port)])


def run_workers(*, host: str, port: int, workers: int, log_level: str) -> None:
    """Run `workers` uvicorn processes of `app_from_env` on one port (they inherit the
    settings from this process' environment); blocks until they stop. Raises SystemExit(1)
    if a worker dies on its own."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise InvalidInputError("several workers need SO_REUSEPORT, which this platform lacks; use --workers 1")
    try:
        reuseport_socket(host, port).close()  # fail here, in the parent, if the port is taken
    except OSError as exc:
        raise InvalidInputError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from exc
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_worker, args=(host, port, log_level), name=f"sae-atlas-worker-{i}")
             for i in range(workers)]
    requested = False

    def on_signal(*_: Any) -> None:
        nonlocal requested
        requested = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for proc in procs:
            proc.start()
        while not requested and all(proc.is_alive() for proc in procs):
            procs[0].join(timeout=0.5)
        failed = None if requested else next(proc for proc in procs if not proc.is_alive())
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed is not None:
        log.error("worker %s exited with code %s; stopped the others", failed.name, failed.exitcode)
        raise SystemExit(1)
