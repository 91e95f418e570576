"""The watchdog of a command holding the project lock: if the command dies without cleaning up
(SIGKILL, a crash), it ends every process the command had started, then exits,
releasing the lock it shares. Killing `bertflow run` by its pid alone thus stops its pretraining
child, fine-tuning workers and Prefect server too, and no rerun starts beside them.

It runs as `python -m pipeline.ops.watchdog PID PIPE_FD LOCK_FD` in a session of its own (Ctrl-C
and a kill of the command's process group leave it to do its job). It learns that the command
died from its pipe: the command's end closes without the word "done". Until then it notes the
command's descendants every POLL_SECONDS: once the command is dead they are orphans, no longer
found by walking from it. psutil remembers each process's start time, so a pid reused by an
unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

POLL_SECONDS = 0.5
GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL: a stage may mark its MLflow run FAILED
DONE = b"done"
CLEANUP = "cleaning up after"  # its note in the lock file while it ends a killed command's processes


@contextlib.contextmanager
def guard(lock_fd: int) -> Iterator[None]:
    """Run a watchdog over this process and its descendants while the body runs; it shares
    `lock_fd`, so the lock holds until the watchdog has ended whatever a killed run left."""
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.ops.watchdog", str(os.getpid()), str(read),
                             str(lock_fd)], pass_fds=(read, lock_fd), stdin=subprocess.DEVNULL,
                            start_new_session=True)
    os.close(read)
    try:
        yield
    finally:
        # A normal end (an error included): this process cleans up after itself.
        with contextlib.suppress(OSError):
            os.write(write, DONE)
        os.close(write)
        proc.wait()


def watch(parent_pid: int, pipe_fd: int, lock_fd: int) -> None:
    """Follow `parent_pid`'s descendants until it says done (return) or dies (end them)."""
    import psutil

    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    seen: dict[int, psutil.Process] = {}
    while True:
        ready, _, _ = select.select([pipe_fd], [], [], POLL_SECONDS)
        if ready:
            word = os.read(pipe_fd, len(DONE))
            if word == DONE:
                return
            if not word:  # the parent's end closed without a word: it died
                break
        try:
            for child in parent.children(recursive=True):
                if child.pid != os.getpid():
                    seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            break
    with contextlib.suppress(OSError):  # waiting commands read this and give it a moment
        note(lock_fd, f"{CLEANUP} the killed pid {parent_pid}")
    alive = [p for p in seen.values() if p.is_running()]
    for proc in list(alive):  # and what they started since the last look
        with contextlib.suppress(psutil.Error):
            alive += [c for c in proc.children(recursive=True) if c.pid not in seen]
    psutil.wait_procs(end(alive, GRACE_SECONDS), timeout=GRACE_SECONDS)


def note(lock_fd: int, what: str) -> None:
    """Write "PID\nWHAT" into the lock file: written over the old note, then cut to length, so
    a reader never finds it empty."""
    data = f"{os.getpid()}\n{what}\n".encode()
    os.pwrite(lock_fd, data, 0)
    os.ftruncate(lock_fd, len(data))


def end(procs: list, grace_seconds: float) -> list:
    """SIGTERM `procs` (psutil.Process objects), SIGKILL those still there after `grace_seconds`;
    the ones killed. psutil checks each process's start time: a reused pid is never hit."""
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, left = psutil.wait_procs(procs, timeout=grace_seconds)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return left


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the command; we act if it dies
    watch(*map(int, sys.argv[1:4]))
