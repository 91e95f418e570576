"""Progress bars for people at a terminal; none in CI (`CI=true`), none when stderr is a log
file or pipe, none with `BERTFLOW_PROGRESS=0`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def enabled() -> bool:
    """Whether to draw progress bars in this process."""
    if os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get("BERTFLOW_PROGRESS") == "0":
        return False
    return sys.stderr.isatty()


def bar(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
    """`items`, drawn as a progress bar on stderr when bars are enabled."""
    if not enabled():
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True,
                file=sys.stderr)
