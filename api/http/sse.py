"""Server-sent events (`text/event-stream`) from a blocking generation.

`event_stream(queue, events, root)` runs `events`, an iterator of `(name, payload)` pairs (a
generation holding the model lock, say), on the worker's one-thread model queue, first come
first served like every model run, and sends each pair as soon as it comes as the event
`event: <name>` / `data: <payload as JSON>`. The answer's status and headers are sent
before the work runs, so an error raised by it arrives as a last `error` event with the
service's error body (`api.http.errors`). When the client disconnects, Starlette cancels the
response; the iterator is then closed before its next step, which stops the generation and
frees the queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Executor
from pathlib import Path
from threading import Event
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter

from sae_atlas.api.http.errors import atlas_error_body
from sae_atlas.api.http.json_body import dumps
from sae_atlas.errors import AtlasError

log = logging.getLogger("sae_atlas.http")

MEDIA_TYPE = "text/event-stream"


class EventStream(StreamingResponse):
    """A `text/event-stream` answer, never cached or buffered by a proxy."""

    media_type = MEDIA_TYPE

    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _inlined(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with each local `$ref` replaced by its definition."""
    if isinstance(node, dict):
        if "$ref" in node:
            return _inlined(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {key: _inlined(value, defs) for key, value in node.items() if key != "$defs"}
    if isinstance(node, list):
        return [_inlined(value, defs) for value in node]
    return node


def data_schema(kind: Any) -> dict[str, Any]:
    """The JSON schema of a payload type, self-contained (no `$ref`)."""
    schema = TypeAdapter(kind).json_schema(mode="serialization")
    return _inlined(schema, schema.get("$defs", {}))


def component(name: str) -> dict[str, Any]:
    """A reference to a schema of the OpenAPI document's components."""
    return {"$ref": f"#/components/schemas/{name}"}


def event_schema(events: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The OpenAPI schema of one event of a stream (`{event, data}` as a client parses it),
    from the schema of each event name's JSON data."""
    return {"type": "object", "required": ["event", "data"], "oneOf": [
        {"properties": {"event": {"const": name}, "data": {
            "type": "string", "contentMediaType": "application/json", "contentSchema": schema}}}
        for name, schema in events.items()]}


def sse_event(name: str, data: Any) -> bytes:
    """One event in the wire format (the JSON has no newline, so it is one `data:` line)."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


def _error_event(exc: Exception, root: Path) -> bytes:
    if isinstance(exc, AtlasError):
        return sse_event("error", atlas_error_body(exc, root))
    log.exception("unexpected error in an event stream")
    return sse_event("error", {"error": "internal", "detail": f"internal error ({type(exc).__name__}); "
                                                              "see the server log"})


async def _relay(queue: Executor, events: Iterator[tuple[str, Any]], root: Path) -> AsyncIterator[bytes]:
    """The events of `events`, run on `queue`, as they come; stops `events` when cancelled."""
    loop = asyncio.get_running_loop()
    channel: asyncio.Queue[bytes | None] = asyncio.Queue()
    stop = Event()

    def send(item: bytes | None) -> None:
        try:
            loop.call_soon_threadsafe(channel.put_nowait, item)
        except RuntimeError:  # the event loop has closed (the server is shutting down)
            stop.set()

    def produce() -> None:
        try:
            while not stop.is_set():
                item = next(events, None)
                if item is None:
                    break
                send(sse_event(*item))
        except Exception as exc:  # the answer has started: the error goes out as an event
            send(_error_event(exc, root))
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
            send(None)

    loop.run_in_executor(queue, produce)
    try:
        while (chunk := await channel.get()) is not None:
            yield chunk
    finally:
        stop.set()


def event_stream(queue: Executor, events: Iterator[tuple[str, Any]], root: Path) -> EventStream:
    """The answer that streams `events` (see the module docstring) for the atlas at `root`
    (which an error event's files are named relative to)."""
    return EventStream(_relay(queue, events, root))
