"""Scheduled runs fire: `bertflow serve` with no Prefect API configured starts the project's own
Prefect server (database in <project>/.prefect/); the deployment's cron, every minute here, gets
a scheduled run that runs the pipeline (up to `ingest`, to stay quick), COMPLETED in Prefect and
recorded in the project's MLflow store; SIGTERM stops serve and the server with it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from uuid import UUID

import psutil
import pytest

from tests.conftest import BIN, make_dvc_project, small_params

pytestmark = pytest.mark.slow
DEPLOYMENT = "every-minute"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(pid: int) -> set[psutil.Process]:
    """`pid` and every process below it; a psutil Process is its pid and start time, so a reused
    pid is not it."""
    try:
        top = psutil.Process(pid)
        return {top, *top.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_until_served(repo: Path, serving: subprocess.Popen, log: Path) -> None:
    """Wait until serve has started the project's server and registered its deployment."""
    deadline = time.monotonic() + 240
    while "being served" not in log.read_text():
        assert serving.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    assert json.loads((repo / ".prefect" / "server.json").read_text())["owner"] == serving.pid


@contextlib.contextmanager
def _prefect(api: str):
    """A Prefect client of the API at `api`."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        yield client


def _scheduled_run(api: str, serving: subprocess.Popen, log: Path):
    """The deployment and its first flow run, once that run has ended."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with _prefect(api) as client:
        deployment = client.read_deployment_by_name(f"bertflow-scheduled/{DEPLOYMENT}")
        only_ours = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        deadline = time.monotonic() + 300  # the next minute, then the run (about 30 s)
        while time.monotonic() < deadline:
            ended = [r for r in client.read_flow_runs(deployment_filter=only_ours)
                     if r.state and r.state.is_final()]
            if ended:
                return deployment, ended[0]
            assert serving.poll() is None, log.read_text()[-3000:]
            time.sleep(2)
    server_log = (log.parent / "project" / ".prefect" / "server.log").read_text()
    raise AssertionError(f"no scheduled run ended in 5 minutes:\n{log.read_text()[-3000:]}\n"
                         f"server log:\n{server_log[-3000:]}")


def _top_flow_run(api: str, task_run_id: str) -> UUID:
    """The flow run a task run ran under, up through subflows (the pipeline flow is one)."""
    with _prefect(api) as client:
        flow_run = client.read_flow_run(client.read_task_run(UUID(task_run_id)).flow_run_id)
        while flow_run.parent_task_run_id:
            flow_run = client.read_flow_run(client.read_task_run(flow_run.parent_task_run_id).flow_run_id)
        return flow_run.id


def _first_mlflow_runs(repo: Path) -> dict:
    """The project's first MLflow run of each name (the next minute's run may have begun)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id],
                              order_by=["attributes.start_time DESC"])
    return {r.info.run_name: r for r in runs}  # the earliest of each name is written last


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM to serve alone (as `kill` or a service manager sends it); SIGKILL its group if
    it hangs."""
    try:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def test_a_served_cron_schedule_fires_on_the_projects_own_prefect_server(tmp_path):
    repo = make_dvc_project(tmp_path / "project", small_params(
        tracking={"uri": "sqlite:///mlflow.db"}, schedule={"cron": "* * * * *", "deployment": DEPLOYMENT}))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # nothing configured
    env.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PREFECT_HOME=str(tmp_path / "home"))
    port, log = _free_port(), tmp_path / "serve.log"
    api = f"http://127.0.0.1:{port}/api"
    start = time.monotonic()
    serving = subprocess.Popen(["bertflow", "serve", "--until", "ingest", "--port", str(port)],
                               cwd=repo, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    started: set[psutil.Process] = set()
    try:
        started |= _tree(serving.pid)
        _wait_until_served(repo, serving, log)
        started |= _tree(serving.pid)  # the server
        deployment, run = _scheduled_run(api, serving, log)
        assert run.state.is_completed(), (run.state, log.read_text()[-5000:])
        runs = _first_mlflow_runs(repo)
        ingest_flow_run = _top_flow_run(api, runs["ingest"].data.tags["bertflow.run_key"])
    finally:
        started |= _tree(serving.pid)  # and the flow run's process if it has not exited yet
        code = _stop(serving)
        time.sleep(1)
        leaked = [process for process in started if _alive(process)]
        for process in leaked:  # serve should have stopped them; the test cleans up all the same
            process.kill()
    print(f"serve started, fired, ran and stopped in {time.monotonic() - start:.0f} s")
    output = log.read_text()
    assert not leaked, f"processes outlived `bertflow serve`: {leaked}\n{output[-3000:]}"
    assert f"Prefect UI: http://127.0.0.1:{port}" in output
    assert code == 0 and not (repo / ".prefect" / "server.json").exists(), output[-3000:]
    assert (repo / ".prefect" / "prefect.db").is_file()  # the server's state is the project's

    # Prefect: the scheduler made the run (not a manual trigger) on the cron, and it completed.
    assert deployment.schedules[0].schedule.cron == "* * * * *"
    assert run.auto_scheduled and run.expected_start_time.second == 0
    assert run.parameters == {"params_path": str(repo / "params.yaml"), "until": "ingest"}

    # MLflow: the pipeline's run, and its ingest stage run under it, made by that flow run.
    assert sorted(runs) == ["ingest", "pipeline"]  # no stage after ingest ran
    assert runs["pipeline"].info.status == runs["ingest"].info.status == "FINISHED"
    assert runs["pipeline"].data.params["until"] == "ingest"
    assert runs["ingest"].data.tags["mlflow.parentRunId"] == runs["pipeline"].info.run_id
    assert ingest_flow_run == run.id  # the ingest run's key is a task run of the scheduled run
