"""SIGTERM and SIGINT in one place: what they end, and how.

SIGTERM (a `kill`, a service manager, a scheduler's timeout) ends a stage or a run as a failure:
`Terminated`, exit code 143, its MLflow run FAILED rather than left RUNNING. `bertflow stage`
ends at once (`ends_on_sigterm`); a flow run passes the signal on to the stage process it waits
for (`forwarded_to`), which ends so, and fails with it. The servers (`bertflow ui`,
`serve-model`, `serve`) stop on SIGTERM as on Ctrl-C (`stop_on_signals`), exit code 0.
components.core.tracking holds SIGTERM back while it opens or closes a run, then hands it to
the handler installed here. A server this process started in a session of its own is stopped
with its whole process group (`stop_group`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

EXIT_CODE = 128 + signal.SIGTERM
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_RECEIVED = threading.Event()  # a SIGTERM arrived in the current ends_on_sigterm block
_FORWARDED: set[subprocess.Popen] = set()  # the stage processes a SIGTERM goes to now


class Terminated(SystemExit):
    """SIGTERM ended this: the stage or run it reached failed, exit code 143. A SystemExit, so
    that no `except Exception` on the way out (a library's retry, a clean-up) stops it."""

    def __init__(self, why: str = "terminated by SIGTERM") -> None:
        super().__init__(why)
        self.code = EXIT_CODE


@contextlib.contextmanager
def ends_on_sigterm(kill_children: bool = True) -> Iterator[None]:
    """In the block, SIGTERM raises Terminated wherever the main thread is, or goes to the
    stage processes `forwarded_to` names if any run. `kill_children`: this process's other
    children (a stage's loader workers and pools) are killed first, so that nothing waits for
    their fits on the way out; the lock's watchdog stays to the end. A flow leaves its own
    (Prefect's server records how it ended). Signals reach only the main thread; elsewhere
    this does nothing.

    Python swallows an exception raised in a garbage-collector callback or a `__del__` (it
    hands it to sys.unraisablehook): the stage would train on. Such a swallowed Terminated
    sends the SIGTERM again, to land in ordinary code. Whatever else the way out raises
    (torch's check of the loader workers just killed, a broken process pool), a terminated
    block raises Terminated, which names it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame) -> None:
        _RECEIVED.set()
        if _FORWARDED:
            for proc in list(_FORWARDED):
                proc.terminate()
            return
        if kill_children:
            _kill_children()
        raise Terminated

    def swallowed(unraisable) -> None:
        if isinstance(unraisable.exc_value, Terminated):  # later: one raised in here is lost too
            resend = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
            resend.daemon = True
            resend.start()
        else:
            previous_hook(unraisable)

    _RECEIVED.clear()
    previous, previous_hook = signal.signal(signal.SIGTERM, terminated), sys.unraisablehook
    sys.unraisablehook = swallowed
    try:
        yield
    except Exception as e:
        if not _RECEIVED.is_set():
            raise
        raise Terminated(f"terminated by SIGTERM; on the way out: {type(e).__name__}: {e}") from e
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook


def received() -> bool:
    """Whether a SIGTERM arrived in the current ends_on_sigterm block (in any thread's view:
    a flow's next stage is not started after one)."""
    return _RECEIVED.is_set()


@contextlib.contextmanager
def forwarded_to(proc: subprocess.Popen) -> Iterator[None]:
    """In the block, a SIGTERM goes to `proc` (a stage's process, which ends as a failure: its
    MLflow run FAILED, its temp outputs removed) instead of ending this process at once; the
    caller raises Terminated once `proc` has ended (see `received`)."""
    _FORWARDED.add(proc)
    try:
        yield
    finally:
        _FORWARDED.discard(proc)


def _kill_children() -> None:
    """SIGKILL every process below this one but the project lock's watchdog."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "pipeline.ops.watchdog" not in " ".join(child.cmdline()):
                child.kill()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """In the block, SIGTERM and SIGINT raise KeyboardInterrupt: a server stops alike on Ctrl-C,
    `kill` and a service manager. SIGINT too, whatever it inherited: started in the background
    of a script, a process inherits SIGINT ignored, and `kill -INT` must still stop it."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ignore_stop_signals() -> None:
    """Already stopping: a second Ctrl-C or SIGTERM must not cut the clean-up short (the
    handlers before stop_on_signals come back at the end of its block)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt


def stop_group(proc: subprocess.Popen, grace_seconds: float = 10.0) -> None:
    """SIGTERM the process group of `proc` (a server started in a session of its own, so that
    its workers stop with it); SIGKILL what is still there after `grace_seconds`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # nothing left
        deadline = time.monotonic() + grace_seconds
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie still counts as a member
            time.sleep(0.1)
        if not _group_alive(proc.pid):
            break
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
