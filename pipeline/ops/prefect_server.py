"""The project's own Prefect server: `prefect server start` on loopback, its database and log in
<project>/.prefect/. Prefect's temporary (ephemeral) server never creates scheduled runs, so
`bertflow serve` needs a real one when no Prefect API is configured.

`bertflow serve` starts it and stops it when it ends; `bertflow server start` leaves it running
(and its UI) until `bertflow server stop`. .prefect/server.json records where it listens and
which `bertflow serve`, if any, stops it, so that no second server opens the same database.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from components.core.errors import BertflowError
from pipeline.ops import signals

HOST = "127.0.0.1"  # this machine only: the API has no authentication
DEFAULT_PORT = 4200  # Prefect's own default, where its docs say the UI is
# 17 s on a quiet 2-core machine; the first start (database migrations) on a busy one is slower.
STARTUP_SECONDS = 180.0
# How long `bertflow run` waits for Prefect's temporary server (pipeline/ops/env.py sets 120 s).
STARTUP_TIMEOUT_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
_OWN_SERVER = ("run on the project's Prefect server: `bertflow server start`, then export the "
               "PREFECT_API_URL it prints")


@dataclass(frozen=True)
class Server:
    """A running project server: its process (leader of its own process group) and port;
    `owner` is the pid of the `bertflow serve` that stops it, None if it stays up."""

    pid: int
    port: int
    owner: int | None = None

    @property
    def url(self) -> str:
        """The UI."""
        return f"http://{HOST}:{self.port}"

    @property
    def api_url(self) -> str:
        """What PREFECT_API_URL is set to."""
        return f"{self.url}/api"


def home(root: Path) -> Path:
    """The server's PREFECT_HOME: its database (prefect.db), log and state file (git-ignored)."""
    return Path(root).resolve() / ".prefect"


def configured_api_url() -> str | None:
    """The Prefect API the user configured (PREFECT_API_URL, from the environment or the active
    Prefect profile), if any."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def check_configured_api() -> str | None:
    """The configured Prefect API, if any, after checking it answers: else one clear error (a
    flow would end in a long traceback from deep inside Prefect's client)."""
    url = configured_api_url()
    if url and not healthy(url.rstrip("/"), timeout=10.0):
        raise BertflowError(f"the Prefect API at {url} (PREFECT_API_URL) does not answer: start "
                            "that server, or unset PREFECT_API_URL to run without one")
    return url


def api_for_run() -> str:
    """The Prefect API a `bertflow run` talks to: the configured one, checked; else Prefect's
    temporary server, started now (see start_temporary)."""
    return check_configured_api() or start_temporary()


def start_temporary() -> str:
    """Start Prefect's temporary (ephemeral) server and return its API URL. Prefect's client
    would start it at the flow's first call, and a slow start ended there in a long traceback
    from inside the flow engine; started here, it is one error naming the fix, and the
    client reuses this server (one per process)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    settings = get_current_settings().server.ephemeral
    if not settings.enabled:  # Prefect's client would refuse with a traceback
        raise BertflowError("no Prefect API: PREFECT_API_URL is unset and Prefect's temporary "
                            f"server is off (PREFECT_SERVER_EPHEMERAL_ENABLED); {_OWN_SERVER}")
    server = SubprocessASGIServer()
    try:
        server.start()
    except RuntimeError as e:  # a timeout, or no free port: Prefect raises nothing narrower
        proc = server.server_process
        code = proc.poll() if proc is not None else None
        server.stop()  # not left starting until this process exits
        fix = _OWN_SERVER
        if code is not None:
            why = f"exited with code {code} before it answered (its output is above)"
        elif str(e).startswith("Timed out"):
            why = (f"did not answer within {settings.startup_timeout_seconds} s "
                   f"({STARTUP_TIMEOUT_SETTING}; a busy machine starts it slowly)")
            fix = f"give it longer (export {STARTUP_TIMEOUT_SETTING}=300), or {_OWN_SERVER}"
        else:
            why = f"did not start ({str(e).splitlines()[0]})"
        raise BertflowError(f"Prefect's temporary API server {why}: {fix}") from None
    return server.api_url


def scheduler_problem() -> str | None:
    """Why a Prefect server run from this environment would never create a scheduled run, if
    so: Prefect 3.8's scheduler inserts runs in a way SQLAlchemy 2.1 refuses (an
    InvalidRequestError, "Can't evaluate bulk DML statement", in the server log at every pass)."""
    from importlib.metadata import version

    def minor(package: str) -> tuple[int, int]:
        major, minor_, *_ = version(package).split(".")
        return int(major), int(minor_)

    if minor("prefect") < (3, 9) and minor("sqlalchemy") >= (2, 1):
        return (f"Prefect {version('prefect')} schedules no runs with SQLAlchemy "
                f"{version('sqlalchemy')}: pip install 'sqlalchemy>=2.0,<2.1'")
    return None


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    """Whether the Prefect API at `api_url` answers its health check."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def running(root: Path) -> Server | None:
    """The project's server if its process is alive (else its stale state file is removed)."""
    state = home(root) / "server.json"
    try:
        server = Server(**json.loads(state.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None
    if is_alive(server.pid) and _is_prefect_server(server.pid):
        return server
    state.unlink(missing_ok=True)
    return None


def start(root: Path, port: int = DEFAULT_PORT, owner: int | None = None,
          say: Callable[[str], None] = print) -> tuple[Server, subprocess.Popen | None]:
    """The project's server, started unless it already runs, and healthy. Returns the process
    when this call started it (None when it reused a running one)."""
    with _start_lock(root):
        server = running(root)
        if server and server.owner is not None and not is_alive(server.owner):
            say(f"stopping the Prefect server (pid {server.pid}) left by a killed `bertflow serve`")
            stop(root)
            server = None
        if server:
            if server.owner is not None and owner is not None:
                raise BertflowError(f"`bertflow serve` (pid {server.owner}) already serves this "
                                    "project; stop it first")
            _wait_healthy(server, None, home(root) / "server.log")
            return server, None
        return _spawn(root, _free_port(port, say), owner, say)


def stop(root: Path, grace_seconds: float = 15.0) -> Server | None:
    """Stop the project's server (its whole process group) and forget it; None if none ran."""
    server = running(root)
    if server is None:
        return None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, sig)
        deadline = time.monotonic() + grace_seconds
        while is_alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not is_alive(server.pid):
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)  # anything it left in its group
    (home(root) / "server.json").unlink(missing_ok=True)
    return server


@contextlib.contextmanager
def serving_api(root: Path, port: int = DEFAULT_PORT,
                say: Callable[[str], None] = print) -> Iterator[str]:
    """The Prefect API for `bertflow serve`: the configured one; else the project's server,
    reused if it runs, else started here and stopped (with its process group) on exit."""
    configured = check_configured_api()
    if configured:
        say(f"Prefect API: {configured} (PREFECT_API_URL)")
        yield configured
        return
    if problem := scheduler_problem():
        raise BertflowError(problem)
    server, proc = start(root, port, owner=os.getpid(), say=say)
    say(f"Prefect UI: {server.url} (the project's server, database in {home(root)}); "
        + ("it stops when this does; `bertflow server start` keeps one up" if proc else
           "it stays up: `bertflow server stop` stops it"))
    try:
        yield server.api_url
    finally:
        if proc is not None:
            signals.stop_group(proc)
            (home(root) / "server.json").unlink(missing_ok=True)


def _spawn(root: Path, port: int, owner: int | None,
           say: Callable[[str], None]) -> tuple[Server, subprocess.Popen]:
    """Start `prefect server start` in a session of its own and wait until it answers."""
    folder = home(root)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "server.log"
    env = {**os.environ, "PREFECT_HOME": str(folder)}
    env.pop("PREFECT_API_URL", None)  # the server is the API; it must not point elsewhere
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]
    with log.open("ab") as out:
        # Its own session: Ctrl-C at the terminal reaches `bertflow serve`, which stops the
        # runner first and the server last. An owned server also dies with its owner, even if
        # the owner is killed outright (SIGKILL leaves no chance to stop it).
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent() if owner is not None else None)
    server = Server(pid=proc.pid, port=port, owner=owner)
    (folder / "server.json").write_text(json.dumps(asdict(server)))
    say(f"starting the project's Prefect server on port {port} (log: {log})")
    try:
        _wait_healthy(server, proc, log)
    except BaseException:
        signals.stop_group(proc)
        (folder / "server.json").unlink(missing_ok=True)
        raise
    return server, proc


def _wait_healthy(server: Server, proc: subprocess.Popen | None, log: Path) -> None:
    """Wait until the server answers; a clear error with its log's end if it exits or hangs."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while not healthy(server.api_url):
        exited = proc.poll() is not None if proc else not is_alive(server.pid)
        if exited or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise BertflowError(f"the Prefect server on port {server.port} "
                                f"{'exited' if exited else 'did not answer'}; its log ({log}):\n{tail}")
        time.sleep(0.5)


def _free_port(preferred: int, say: Callable[[str], None]) -> int:
    """`preferred` if nothing listens on it, else a free port the system picks."""
    with socket.socket() as s:
        # As the server binds: a port whose last connections linger in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, preferred))
            return preferred
        except OSError:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
    say(f"port {preferred} is taken; using {port}")
    return port


@contextlib.contextmanager
def _start_lock(root: Path) -> Iterator[None]:
    """One command at a time decides whether to start the server: two servers on one SQLite
    database would fight over it."""
    folder = home(root)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "server.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or the holder dies
        yield


def is_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_prefect_server(pid: int) -> bool:
    """Whether `pid` is a `prefect server start` (not another process that got its pid)."""
    import psutil

    try:
        args = psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # cannot look: trust the state file
    return "prefect" in args and "server" in args and "start" in args


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn (Linux) that has the child get SIGTERM when its parent dies; libc is loaded
    here, so that the forked child only makes the one call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)
