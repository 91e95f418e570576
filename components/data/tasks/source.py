"""What a task source is and what its readers share: the splits and roles, the loading
context (which counts what was dropped or repaired, for the stats), splitting and text reading."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.core.config import TaskConfig
from components.core.errors import DataError
from components.core.io import special_file
from components.data.tasks.folder import SPLIT_NAMES
from components.data.text import decode_bytes

log = logging.getLogger(__name__)
ROLES = {
    "classification": ("text", "label"),
    "pair": ("text_a", "text_b", "label"),
    "token": ("tokens", "tags"),
    "span": ("tokens", "tags"),
}
FALLBACK = "cp1252"  # encoding tried for text that is not UTF-8 (as ingest does)

Example = dict[str, Any]
"""One example: its role columns plus `_where` (file and line/row) for messages, never written."""


@dataclass
class Context:
    """What a loader needs and what it reports back."""

    name: str
    task: TaskConfig
    root: Path
    packages_dir: Path
    dropped: Counter = field(default_factory=Counter)
    changed: Counter = field(default_factory=Counter)
    source: str = ""
    split: str = ""
    files: dict[str, Path] = field(default_factory=dict)
    """The given file of each split, when the source has given splits."""
    scheme: str = ""
    """Token and span tasks: the tag scheme, `bio` or `plain`, once resolved."""


def seeded_split(items: list, fractions: dict[str, float], seed: int) -> dict[str, list]:
    """Split `items` by a seeded permutation; `train` takes the rest; source order is kept."""
    n = len(items)
    total = sum(fractions.values())
    order = np.random.default_rng(seed).permutation(n)
    out, start = {}, 0
    for split in (s for s in fractions if s != "train"):
        size = round(n * fractions[split] / total) if total else 0
        out[split] = [items[i] for i in sorted(order[start:start + size])]
        start += size
    out["train"] = [items[i] for i in sorted(order[start:])]
    return out


def split_all(items: list, ctx: Context) -> dict[str, list]:
    """The task's fractions and seed applied to a source without given splits."""
    ctx.split = f"seeded: fractions {list(ctx.task.split)}, seed {ctx.task.split_seed}"
    return seeded_split(items, dict(zip(SPLIT_NAMES, ctx.task.split, strict=True)),
                         ctx.task.split_seed)


def read_text(path: Path, changed: Counter | None = None) -> str:
    """A text file as str: UTF-8, else the fallback encoding (counted in `changed` and logged,
    when given: a user's file); unreadable files and FIFOs, sockets or devices are errors."""
    if kind := special_file(path):
        raise DataError(f"{path}: {kind}, not a regular file; give a file (reading it would wait "
                        "for a writer or never end)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read the file ({e.strerror or e})") from None
    text, status = decode_bytes(data, FALLBACK)
    if status == "binary":
        raise DataError(f"{path}: not a readable text file (binary content)")
    if status == "fallback" and changed is not None:
        changed["non_utf8_decoded_files"] += 1
        log.warning("%s is not UTF-8; decoded as %s (save it as UTF-8 to be sure)", path, FALLBACK)
    return text or ""


def short(value: Any, limit: int = 80) -> str:
    """A value's repr, cut to `limit` characters for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
