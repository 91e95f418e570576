"""A request-body limit for REST serving: MLflow's scoring server reads a whole request body
into memory before the model sees any of it, so the limit sits in front of it, as ASGI
middleware (`bertflow serve-model`, pipeline/ops/scoring_app.py)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Message = dict[str, Any]
ASGIApp = Callable[[dict, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]
MAX_BODY_ENV = "BERTFLOW_MAX_BODY_BYTES"


class BodyLimit:
    """Wraps an ASGI app: a request whose body is over `max_bytes` gets 413 and a JSON message
    (MLflow's error shape), decided from its Content-Length or, for a chunked body, as soon as
    more than `max_bytes` has arrived; the app never sees it. Other requests reach the app
    unchanged, their body read first (at most `max_bytes` held)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, f"{int(declared):,} bytes")
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(send, f"over {self.max_bytes:,} bytes")
                return
            more = message.get("more_body", False)
        body = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:  # the body once, then whatever comes (a disconnect)
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Callable[[Message], Awaitable[None]], size: str) -> None:
        text = json.dumps({"error_code": "REQUEST_TOO_LARGE",
                           "message": f"the request body is {size}; at most {self.max_bytes:,} "
                                      "bytes (bertflow serve-model --max-body-mb): send fewer "
                                      "rows per request"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(text)).encode())]})
        await send({"type": "http.response.body", "body": text})
