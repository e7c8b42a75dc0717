"""A ceiling on request bodies, before anything reads them.

FastAPI reads and parses whatever body arrives: a 20 MB request took 1.2 GB of memory before
its 400. Here a body is read up to `max_bytes` (a Content-Length over it is refused before
reading) and only then handed to the app; past the ceiling the answer is a 413 in OpenAI's
error shape and the rest is never read.
"""

import json

from inference.wire import error_body


class BodyLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(send)
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._too_large(send)
        return await self.app(scope, _replay(bytes(body), receive), send)

    async def _too_large(self, send) -> None:
        payload = error_body(
            f"The request body is larger than this server accepts ({self.max_bytes} bytes).",
            "invalid_request_error",
            "request_too_large",
        )
        data = json.dumps(payload).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _replay(body: bytes, receive):
    """The whole body as one message, then the connection's own messages (a disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
