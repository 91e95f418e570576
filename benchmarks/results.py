"""benchmarks/RESULTS.md, one `## ...` section per benchmark: each script rewrites its own."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(text: str, path: Path = RESULTS) -> None:
    """Put `text` (a section: its first line is its `## ` title) in place of every section of
    that title in `path`, or at the end if there is none; the others stay as they are. The file
    is replaced atomically: a benchmark stopped midway never truncates the others' results."""
    title = text.splitlines()[0].strip()
    if not title.startswith("## "):
        raise ValueError(f"a RESULTS.md section starts with its '## ' title, not {title!r}")
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    head, *sections = old.split("\n## ")
    kept, placed = [head.rstrip()], False
    for section in sections:
        if ("## " + section.splitlines()[0]).strip() != title:
            kept.append("## " + section.strip())
        elif not placed:  # the first copy's place; later copies are dropped
            kept.append(text.strip())
            placed = True
    if not placed:
        kept.append(text.strip())
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write("\n\n".join(kept) + "\n")
    os.replace(tmp, path)
