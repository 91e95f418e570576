"""`bertflow ui`: the MLflow UI on the project's store, on loopback, stopped as a whole.

The server runs in a session of its own so that stopping it stops its workers too: on Ctrl-C
(or SIGTERM) its whole process group gets SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.ops import signals

PREFECT_HINT = ("Prefect UI: `bertflow server start` (the project's server, on http://127.0.0.1:4200), "
                "then `export PREFECT_API_URL=http://127.0.0.1:4200/api` before `bertflow run`.")


def mlflow_ui_command(params: Path, host: str, port: int) -> list[str]:
    """The `mlflow server` command line for the project's tracking store and artifacts."""
    from components.core import tracking
    from components.core.params import load_params

    params = Path(params).resolve()
    cfg = load_params(params).tracking
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
            tracking.tracking_uri(cfg, params.parent), "--default-artifact-root",
            tracking.artifact_location(cfg, params.parent),
            "--host", host, "--port", str(port), "--workers", "1"]


def check_port(host: str, port: int, what: str = "the MLflow UI") -> None:
    """A clear error if `port` on `host` cannot be listened on (taken, or not this machine's):
    the MLflow server would print a bind error and still exit 0."""
    import socket

    from components.core.errors import BertflowError

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise BertflowError(f"cannot serve {what} on {host}:{port}: "
                            f"{os.strerror(e.errno) if e.errno else e}; "
                            "pick another with --port") from None


def serve_ui(params: Path, host: str = "127.0.0.1", port: int = 5000) -> int:
    """Run the MLflow UI until Ctrl-C or SIGTERM; return its exit code."""
    import typer

    check_port(host, port)
    typer.echo(f"MLflow UI: http://{host}:{port} (Ctrl-C stops it)\n{PREFECT_HINT}")
    # Without MLflow's job runner (on by default in MLflow 3): it serves GenAI jobs (judges,
    # prompt optimization, trace roll-ups) that bertflow's runs never create, and a consumer
    # process per kind of job. Measured: 11 processes, 2.4 GB and 27 CPU-s in the UI's first
    # 30 s with it, 3, 0.5 GB and 6 CPU-s without. A value the user set is kept.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    return run_until_stopped(mlflow_ui_command(params, host, port), env)


def run_until_stopped(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run a server command in a session of its own until it exits, or until Ctrl-C or SIGTERM
    stop its whole process group; return its exit code (0 when stopped)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        with signals.stop_on_signals():
            return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signals.stop_group(proc)
