"""Secrets masked where a command's text leaves it outside logging: the consoles (the libraries'
own prints) and the exceptions an orchestrator stores (components.core.redact says what a secret
is)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from components.core.redact import redact

P = ParamSpec("P")
R = TypeVar("R")


class RedactingStream:
    """A text stream that masks secrets in everything written through it: the libraries' own
    prints (MLflow writes "View run ... at: <tracking URI>" straight to stdout)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def install_stream_redaction() -> None:
    """Route this process's stdout and stderr through RedactingStream (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))


def masks_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate `fn` so that its exceptions go out with secrets masked in their message, their
    type unchanged: an orchestrator stores that message (Prefect's state) where logs don't go."""
    @functools.wraps(fn)
    def masked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            e.args = tuple(redact(a) if isinstance(a, str) else a for a in e.args)
            if isinstance(getattr(e, "message", None), str):  # MLflow's exceptions keep it twice
                e.message = redact(e.message)
            raise

    return masked
