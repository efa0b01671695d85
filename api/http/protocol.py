"""The HTTP/1.1 protocol the server runs: uvicorn's httptools protocol, with the requests it
cannot parse answered in the service's JSON error shape (`api.http.errors`) instead of
uvicorn's plain-text "Invalid HTTP request received.".

httptools parses request URLs of at most `MAX_URL_BYTES` (its offsets are 16-bit), so a
longer one (a 100,000-character query string, say) never reaches the application: it is
answered 414 with `{"error": "http", "detail": ...}` naming the limit, as `/openapi.json`
documents on every data route. Any other request that is not well-formed HTTP/1.1 gets 400
in the same shape. `api.http.app.serve`, its workers and the tests' live server all run it.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from sae_atlas.api.http.errors import error_bytes

MAX_URL_BYTES = 65535
"""The longest request URL (path and query) the server reads."""


def url_too_long(length: int) -> str:
    """The detail of a 414 answer to a URL of `length` bytes."""
    return (f"the request URL is {length} bytes; the limit is {MAX_URL_BYTES} "
            "(send long inputs in a POST body)")


class JsonErrorsProtocol(HttpToolsProtocol):
    """httptools' HTTP/1.1 protocol answering unparsable requests with JSON error bodies."""

    def send_400_response(self, msg: str) -> None:
        """Answer a request the parser refused (414 for a URL over the limit, else 400) and
        close the connection."""
        length = len(getattr(self, "url", b""))
        status, detail = 400, f"malformed HTTP request ({msg.rstrip('.')})"
        if length > MAX_URL_BYTES:
            status, detail = 414, url_too_long(length)
        body = error_bytes("http", detail)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                 b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
