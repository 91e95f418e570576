"""Scheduled pipeline runs: `bertflow serve` serves a Prefect deployment of `scheduled_flow`
with the cron schedule of params.yaml (`schedule`).

Each run: `dvc pull` (when a default remote is set) -> the pipeline flow (DVC reruns only stale
stages, then new models challenge their champions) -> `dvc push`. A run in which nothing changed
skips every stage and registers nothing. With PREFECT_API_URL the deployment lives on that
Prefect server; without it on the project's own (pipeline.prefect_server), which `bertflow serve`
starts unless `bertflow server start` already did: Prefect's temporary server never schedules.
"""

from __future__ import annotations

import contextlib
import signal
import warnings
from pathlib import Path

from prefect import flow, get_run_logger

from components.core.config import load_params
from pipeline import prefect_server, versioning
from pipeline.flow import pipeline_flow
from pipeline.stages import plan


@flow(name="bertflow-scheduled")
def scheduled_flow(params_path: str = "params.yaml", until: str | None = None) -> dict:
    """Pull the data, run what is stale (up to stage `until`), update the registry, push."""
    logger = get_run_logger()
    root = Path(params_path).resolve().parent
    remote = versioning.is_dvc_project(root) and versioning.has_remote(root)
    if remote:
        try:
            versioning.pull(root)
        except Exception as e:  # noqa: BLE001 - the stages recompute what the remote lacks
            logger.warning("dvc pull: %s; stages whose outputs are missing will run", e)
    results = pipeline_flow(params_path, until, wait=True)  # after a run started by hand, if any
    pushed = versioning.push(root) if remote else 0
    logger.info("dvc push: %s files", pushed)
    registry = results.get("registry", {}).get("stats", {})
    return {"ran": [n for n, r in results.items() if r["status"] == "ran" and n != "registry"],
            "registered": registry.get("registered", 0), "pushed": pushed}


def serve(params_path: Path, until: str | None = None, port: int = prefect_server.DEFAULT_PORT) -> None:
    """Serve the deployment until Ctrl-C or SIGTERM, on the configured Prefect API or the
    project's own server (started on `port` or a free one if none runs, and stopped on exit)."""
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL, temporary_settings

    params_path = Path(params_path).resolve()
    p = load_params(params_path)
    plan(p, until)  # a bad stage fails now, not at the first scheduled run
    s = p.schedule
    # SIGINT too: started in the background of a script, serve inherits SIGINT ignored, and
    # `kill -INT` must still stop it. The runner sets its own SIGTERM handler once it starts.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    # Prefect's runner stops on SIGTERM all the same (it pauses the schedule, then exits) but
    # warns that its own coroutine was never awaited.
    warnings.filterwarnings("ignore", message="coroutine 'Runner.astop' was never awaited")
    try:
        with (prefect_server.serving_api(params_path.parent, port) as api_url,
              temporary_settings({PREFECT_API_URL: api_url})):
            try:
                # One run at a time: another would only wait for the project's run lock.
                scheduled_flow.serve(name=s.deployment, schedule=Cron(s.cron, timezone=s.timezone),
                                     parameters={"params_path": str(params_path), "until": until},
                                     limit=1)
            finally:
                for sig in previous:  # already stopping: a second Ctrl-C must not cut it short
                    signal.signal(sig, signal.SIG_IGN)
                _end_flow_runs()  # while the API is up: they report their end to it
    except KeyboardInterrupt:
        pass  # a signal before the runner started: the server is stopped all the same
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # unwinds through the `with`, which stops the server


def _end_flow_runs(grace_seconds: float = 30.0) -> None:
    """End the flow runs the runner still has going: SIGTERM to each and all it started (Prefect
    marks the runs crashed), then SIGKILL for what is left. The runner leaves them running on
    SIGTERM, and one whose API has gone hangs at exit: nothing outlives `bertflow serve`."""
    import multiprocessing

    import psutil

    from pipeline.watchdog import end

    runs = multiprocessing.active_children()  # the runner starts each flow run as one
    # All of each run, as Ctrl-C reaches the whole job: a stage's process too. Prefect's handler
    # can miss SIGTERM (raised where it is ignored): SIGKILL after the grace period.
    end(_tree([run.pid for run in runs]), grace_seconds)
    for proc in _tree([run.pid for run in runs if run.is_alive()]):  # what a run started since
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    for run in runs:
        run.join()


def _tree(pids: list[int]) -> list:
    """The processes of `pids` and every process below them (psutil.Process objects)."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(pid)
            procs += [top, *top.children(recursive=True)]
    return procs
