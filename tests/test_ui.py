"""`bertflow ui`: the MLflow UI on the project's store, on loopback only, and Ctrl-C stops
it with every process it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from itertools import pairwise

import psutil
import pytest

from tests.conftest import BIN, run_cli, section, small_params, write_params

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outside_address() -> str | None:
    """An address of this machine other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent for a UDP connect
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_ui_serves_the_project_runs_on_loopback_and_stops_whole_on_ctrl_c(tmp_path):
    import httpx

    from components.core import tracking
    from components.core.config import TrackingConfig

    params = write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    with tracking.mlflow_run(section(TrackingConfig, uri="sqlite:///mlflow.db"), tmp_path, "ingest"):
        pass
    port = _free_port()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(["bertflow", "ui", "--port", str(port), "-p", str(params)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline, answer = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                answer = httpx.post(f"{url}/api/2.0/mlflow/runs/search", timeout=5,
                                    json={"experiment_ids": ["1"]})
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert answer is not None and answer.status_code == 200, proc.poll()
        assert [r["info"]["run_name"] for r in answer.json()["runs"]] == ["ingest"]  # our store
        # No MLflow job runner beside it (its GenAI jobs are none of a bertflow project's).
        started = [" ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(recursive=True)]
        assert any("mlflow server" in line for line in started), started
        assert not [line for line in started if "mlflow.server.jobs" in line], started
        outside = _outside_address()
        if outside:  # nothing answers on the machine's other interfaces
            with pytest.raises(httpx.TransportError):
                httpx.get(f"http://{outside}:{port}/", timeout=5)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        output = proc.communicate(timeout=60)[0]
    assert f"MLflow UI: {url}" in output and "bertflow server start" in output
    time.sleep(1)
    with pytest.raises(httpx.TransportError):  # the server and its workers are gone
        httpx.get(url, timeout=5)
    # Nothing of what it started is left: the server ran in a process group of its own.
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if _serves_on(p.info["cmdline"] or [], port)]


def _serves_on(cmdline: list[str], port: int) -> bool:
    """Whether a command line has `--port PORT`."""
    return any(a == "--port" and b == str(port) for a, b in pairwise(cmdline))


def test_ui_on_a_taken_port_is_one_clear_error_and_a_failure(tmp_path):
    params = write_params(tmp_path, small_params(tracking={"uri": "sqlite:///mlflow.db"}))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = run_cli("bertflow", "ui", "--port", str(port), "-p", str(params), cwd=tmp_path,
                      check=False)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: cannot serve the MLflow UI on 127.0.0.1:{port}: Address already in use; pick "
        "another with --port"]
