"""One pipeline run at a time per project: two runs would race on the same outputs, dvc.lock
and DVC cache. An advisory lock (flock) on a file in .dvc/tmp: the kernel releases it when the
holder exits, even on SIGKILL, so a crashed run never leaves the project locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from components.core.errors import BertflowError


def lock_path(root: Path) -> Path:
    """Where the lock lives: DVC's own temp folder (git-ignored by DVC), else the project root."""
    tmp = root / ".dvc" / "tmp"
    return tmp / "bertflow-run.lock" if (root / ".dvc").is_dir() else root / ".bertflow-run.lock"


@contextlib.contextmanager
def project_lock(root: Path, wait: bool = False, poll_seconds: float = 2.0) -> Iterator[None]:
    """Hold the project's run lock; if another run holds it, wait for it or refuse."""
    path = lock_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = Path(path).read_text().strip() or "unknown"
                if not wait:
                    raise BertflowError(
                        f"another bertflow run (pid {holder}) is running in {root}; wait for it to "
                        "finish, or run with --wait") from None
                time.sleep(poll_seconds)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)  # releases the lock
