"""benchmarks/RESULTS.md, one `## ...` section per benchmark: each script rewrites its own, and
says under its title when and on what machine its figures were measured (`measured`)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def _sections(text: str) -> tuple[str, list[str]]:
    """What comes before the first `## ` section, and each section with its `## ` title."""
    head, *sections = text.split("\n## ")
    return head, ["## " + section for section in sections]


def _title(section: str) -> str:
    return section.splitlines()[0].strip()


def read_section(title: str, path: Path = RESULTS) -> str:
    """The first section titled `title` in `path` (its title line included), or "" if none."""
    old = path.read_text() if path.exists() else ""
    return next((sec for sec in _sections(old)[1] if _title(sec) == title.strip()), "")


def write_section(text: str, path: Path = RESULTS) -> None:
    """Put `text` (a section: its first line is its `## ` title) in place of every section of
    that title in `path`, or at the end if there is none; the others stay as they are. The file
    is replaced atomically: a benchmark stopped midway never truncates the others' results."""
    title = _title(text)
    if not title.startswith("## "):
        raise ValueError(f"a RESULTS.md section starts with its '## ' title, not {title!r}")
    head, sections = _sections(path.read_text() if path.exists() else "# Benchmark results\n")
    kept, placed = [head.rstrip()], False
    for section in sections:
        if _title(section) != title:
            kept.append(section.strip())
        elif not placed:  # the first copy's place; later copies are dropped
            kept.append(text.strip())
            placed = True
    if not placed:
        kept.append(text.strip())
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write("\n\n".join(kept) + "\n")
    os.replace(tmp, path)


def measured() -> str:
    """`Measured DATE on MACHINE.`, the line under a section's title: the CPU model, its family,
    model and stepping and the flags that select kernels (components.core.machine), torch's
    threads and version, and the GPU torch sees, if any."""
    import torch

    from components.core.machine import cpu_facts

    f = cpu_facts()
    gpu = f"GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no GPU"
    return (f"Measured {date.today().isoformat()} on {f['cpu_model']} ({f['cpu_id'] or 'id unknown'}; "
            f"flags {f['cpu_flags'] or 'none listed'}), {f['threads']} threads, torch {f['torch']}, {gpu}.")


def interleaved(rounds: int, keys: list, measure: Callable[[Any], Any]) -> dict[Any, list]:
    """`measure(key)` for every key, `rounds` times over, round by round, so that a busy spell
    of the machine hits every variant alike: each key's results in round order."""
    got: dict[Any, list] = {key: [] for key in keys}
    for _ in range(rounds):
        for key in keys:
            got[key].append(measure(key))
            print(key, got[key][-1], flush=True)
    return got
