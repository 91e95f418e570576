"""One pipeline command at a time per project: two runs, or a run and a `bertflow stage` (what
`dvc repro` calls), would race on the same outputs, dvc.lock and DVC cache.

An advisory lock (flock) on a file in .dvc/tmp, held by the command and by its watchdog
(pipeline.ops.watchdog): if the command is killed (SIGKILL included), the watchdog ends every
process the command started (stage subprocesses, fine-tuning workers, Prefect's temporary
server) and only then lets the lock go, so a rerun never starts beside an orphaned one. The
kernel releases a flock when its last holder exits, so nothing ever leaves the project locked.
A stage the holder starts in its own process runs under its lock: the holder gives it
`under_lock(root)` in its environment, and the stage finds the holder among its ancestors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from components.core.errors import BertflowError
from pipeline.ops import watchdog

HOLDER_ENV = "BERTFLOW_LOCK_HOLDER"  # "PID:ROOT" of the process holding ROOT's lock
CLEANUP_WAIT_SECONDS = 60.0  # how long a new command waits for that clean-up, --wait or not


def lock_path(root: Path) -> Path:
    """Where the lock lives: DVC's own temp folder (git-ignored by DVC), else the project root."""
    tmp = root / ".dvc" / "tmp"
    return tmp / "bertflow-run.lock" if (root / ".dvc").is_dir() else root / ".bertflow-run.lock"


def holder(root: Path) -> tuple[str, str]:
    """(pid, what) of the lock's last holder, as written in the lock file."""
    pid, _, what = lock_path(root).read_text().partition("\n")
    return pid.strip() or "unknown", what.strip() or "bertflow run"


def under_lock(root: Path) -> dict[str, str]:
    """Environment for a process this lock holder starts to run under its lock."""
    return {HOLDER_ENV: f"{os.getpid()}:{Path(root).resolve()}"}


def held_by_ancestor(root: Path) -> bool:
    """Whether a process this one descends from holds `root`'s lock (this is its stage child)."""
    import psutil

    pid, _, locked = os.environ.get(HOLDER_ENV, "").partition(":")
    if not pid.isdigit() or Path(locked) != Path(root).resolve():
        return False
    return int(pid) in {p.pid for p in psutil.Process().parents()}


@contextlib.contextmanager
def project_lock(root: Path, wait: bool = False, poll_seconds: float = 2.0,
                 what: str = "bertflow run") -> Iterator[None]:
    """Hold the project's lock as `what` (named to whoever is refused); if another command holds
    it, wait for it or refuse. A command the holder started with `under_lock` runs under it."""
    root = Path(root).resolve()
    if held_by_ancestor(root):
        yield
        return
    path = lock_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, root, wait, poll_seconds)
        watchdog.note(fd, what)
        with watchdog.guard(fd):
            yield
    finally:
        os.close(fd)  # releases the lock (the watchdog has closed its copy)


def _running(pid: str) -> bool:
    """Whether `pid` names a live process (a zombie, killed but not yet reaped, is not)."""
    import psutil

    try:
        return pid.isdigit() and psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _acquire(fd: int, root: Path, wait: bool, poll_seconds: float) -> None:
    """Take the flock on `fd`: at once, after waiting (`wait`, or a watchdog cleaning up after a
    killed run, which takes seconds), or refuse naming the holder."""
    cleanup_deadline = time.monotonic() + CLEANUP_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid, what = holder(root)
            # A holder just killed (its watchdog about to note the clean-up) or a note being
            # rewritten reads as a dead or unknown pid: that too is a clean-up under way.
            cleaning = what.startswith(watchdog.CLEANUP) or not _running(pid)
            if not wait and not (cleaning and time.monotonic() < cleanup_deadline):
                raise BertflowError(f"another {what} (pid {pid}) is running in {root}; wait for it "
                                    "to finish, or run with --wait") from None
            time.sleep(min(poll_seconds, 0.2) if cleaning else poll_seconds)
