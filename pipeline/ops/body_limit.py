"""Limits on a REST request's body: MLflow's scoring server reads a whole request body into
memory, then parses its JSON recursively, before the model sees any of it; so the limits sit
in front of it, as ASGI middleware (`bertflow serve-model`, pipeline/ops/scoring_app.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

Message = dict[str, Any]
ASGIApp = Callable[[dict, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]
MAX_BODY_ENV = "BERTFLOW_MAX_BODY_BYTES"
MAX_DEPTH = 32
"""JSON nesting a request may have: a row of pre-split tokens needs 4 ({"dataframe_records":
[{"tokens": [...]}]}); Python's parser recurses once a level and fails past about 1,000."""
# A JSON string, escapes included; one left open runs to the end (a match that could fail
# would be tried again from every quote after it: quadratic time on `"\"\"\"...`).
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # opening +1, closing -1 (as int8)


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of `body` nest, counted without parsing it; brackets
    inside strings do not count."""
    import numpy as np

    steps = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS).translate(_STEPS)
    return int(np.cumsum(np.frombuffer(steps, np.int8), dtype=np.int32).max(initial=0))


class BodyLimit:
    """Wraps an ASGI app: a request whose body is over `max_bytes` gets 413 and a JSON message
    (MLflow's error shape), decided from its Content-Length or, for a chunked body, as soon as
    more than `max_bytes` has arrived; a JSON body nested deeper than MAX_DEPTH gets 400 (the
    app's parser would overflow the stack: a 500). The app sees neither. Other requests reach
    it unchanged, their body read first (at most `max_bytes` held)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, "REQUEST_TOO_LARGE", self._too_large(f"{int(declared):,} bytes"))
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
                await self._refuse(send, 413, "REQUEST_TOO_LARGE",
                                   self._too_large(f"over {self.max_bytes:,} bytes"))
                return
            more = message.get("more_body", False)
        body = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        mime = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if mime == b"application/json" and (depth := json_depth(body[0]["body"])) > MAX_DEPTH:
            await self._refuse(send, 400, "BAD_REQUEST",
                               f"the request body's JSON nests {depth:,} levels deep; at most "
                               f"{MAX_DEPTH} (a row of texts or tokens needs 4)")
            return

        async def replay() -> Message:  # the body once, then whatever comes (a disconnect)
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)

    def _too_large(self, size: str) -> str:
        """The 413's message: how large, the limit, and what to do."""
        return (f"the request body is {size}; at most {self.max_bytes:,} bytes (bertflow serve-model "
                "--max-body-mb): send fewer rows per request")

    @staticmethod
    async def _refuse(send: Callable[[Message], Awaitable[None]], status: int, code: str,
                      message: str) -> None:
        """Answer `status` with MLflow's error shape: {"error_code": ..., "message": ...}."""
        text = json.dumps({"error_code": code, "message": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(text)).encode())]})
        await send({"type": "http.response.body", "body": text})
