"""Progress for people at a terminal (bars) and for logs (a line about once a minute).

Bars draw only on a terminal: none in CI (`CI=true`) or when stderr is a log file or pipe. A run
under cron, Prefect or `make run > log 2>&1` gets progress lines instead, every
`BERTFLOW_PROGRESS_SECONDS` (60), through logging, so they reach Prefect's run log too.
`BERTFLOW_PROGRESS=0` turns both off.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)
MARK = ": progress: "  # how a progress line reads in a log: `... INFO <logger>: progress: ...`


def enabled() -> bool:
    """Whether to draw progress bars in this process."""
    if os.environ.get("CI", "").lower() in ("1", "true") or not _wanted():
        return False
    return sys.stderr.isatty()


def line_seconds() -> float | None:
    """Seconds between progress lines where bars are not drawn; None where neither is wanted."""
    if enabled() or not _wanted():
        return None
    return max(0.1, float(os.environ.get("BERTFLOW_PROGRESS_SECONDS", "60")))


def _wanted() -> bool:
    return os.environ.get("BERTFLOW_PROGRESS") != "0"


def duration(seconds: float) -> str:
    """`42 s`, `3.5 min` or `1 h 05 min`: a span as a log line gives it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def eta(elapsed: float, done: float, total: float | None) -> str:
    """The time left at the rate so far: `ETA 12.5 min`, or `ETA ?` before anything is done."""
    if not total or done <= 0:
        return "ETA ?"
    return f"ETA {duration(elapsed / done * max(total - done, 0))}"


def bar(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
    """`items`, drawn as a progress bar on stderr at a terminal, else with progress lines."""
    if enabled():
        from tqdm import tqdm

        return tqdm(items, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True,
                    file=sys.stderr)
    seconds = line_seconds()
    return items if seconds is None else _with_lines(items, desc, total, unit, seconds)


def _with_lines(items: Iterable[T], desc: str, total: int | None, unit: str,
                seconds: float) -> Iterator[T]:
    """`items`, with a line every `seconds` from a thread: also while the next item is awaited
    (a fit takes minutes). The thread runs in this context, so Prefect files its lines under the
    task run that iterates."""
    done, start, stop = 0, time.monotonic(), threading.Event()

    def report() -> None:
        while not stop.wait(seconds):
            elapsed = time.monotonic() - start
            of = f"/{total}" if total else ""
            log.info("progress: %s: %d%s %s, %s elapsed, %s", desc, done, of, unit,
                     duration(elapsed), eta(elapsed, done, total))

    threading.Thread(target=contextvars.copy_context().run, args=(report,), daemon=True).start()
    try:
        for item in items:
            yield item
            done += 1
    finally:
        stop.set()
