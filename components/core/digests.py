"""Content digests of files and folders: what decides whether an output can be taken as it is."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def digest(path: Path) -> str:
    """sha256 of a file, or of a folder's files (names and digests, sorted); '' if missing."""
    if path.is_file():
        stat = path.stat()
        return _file_digest(path.resolve(), stat.st_mtime_ns, stat.st_size, stat.st_ino)
    if not path.is_dir():
        return ""
    h = hashlib.sha256()
    for file in sorted(f for f in path.rglob("*") if f.is_file()):
        h.update(f"{file.relative_to(path).as_posix()}\0{digest(file)}\n".encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=65536)
def _file_digest(path: Path, mtime_ns: int, size: int, inode: int) -> str:
    """A file's sha256, read once per version of it in this process (the corpus is read by
    several stages, an encoder by every start)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
