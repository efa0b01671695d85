"""The request-body size limit (ASGI middleware)."""

from __future__ import annotations

from typing import Any

from sae_atlas.api.http.errors import error_bytes

Scope = dict[str, Any]


class BodyLimit:
    """ASGI middleware answering 413 (JSON) to a request body over `max_bytes`, whether it
    declares its length or streams it in chunks."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                await self._reply(send, 400, "invalid Content-Length header")
                return
            if too_big:
                await self._reply(send, 413, self._message())
                return
        received = 0
        started = replied = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, replied
            if replied:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes and not started:
                    await self._reply(send, 413, self._message())
                    replied = True
                    return {"type": "http.disconnect"}  # the app stops reading; its answer is dropped
            return message

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if replied:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            if not replied:
                raise

    def _message(self) -> str:
        return f"request body is larger than the limit of {self.max_bytes} bytes"

    @staticmethod
    async def _reply(send: Any, status: int, detail: str) -> None:
        body = error_bytes("http", detail)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

