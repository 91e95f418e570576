"""Scheduled pipeline runs: `bertflow serve` serves a Prefect deployment of a flow (the CLI
hands it pipeline.flow's `scheduled_flow`) with the cron schedule of params.yaml (`schedule`).

What a scheduled run does is the flow's business (pipeline/flow.py); here: the deployment, the
server it lives on, and ending its runs with the command. With PREFECT_API_URL the deployment lives on that
Prefect server; without it on the project's own (pipeline.ops.prefect_server), which `bertflow serve`
starts unless `bertflow server start` already did: Prefect's temporary server never schedules.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

from prefect import Flow

from components.core.params import load_params
from pipeline.ops import prefect_server, signals


def serve(scheduled: Flow, params_path: Path, until: str | None = None,
          port: int = prefect_server.DEFAULT_PORT) -> None:
    """Serve the flow `scheduled` as the deployment of params' schedule until Ctrl-C or SIGTERM,
    on the configured Prefect API or the project's own server (started on `port` or a free one
    if none runs, and stopped on exit)."""
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL, temporary_settings

    params_path = Path(params_path).resolve()
    s = load_params(params_path).schedule
    # Prefect's runner stops on SIGTERM all the same (it pauses the schedule, then exits) but
    # warns that its own coroutine was never awaited.
    warnings.filterwarnings("ignore", message="coroutine 'Runner.astop' was never awaited")
    try:
        # A signal unwinds through the `with`, which stops the server; the runner sets its own
        # SIGTERM handler once it starts.
        with (signals.stop_on_signals(),
              prefect_server.serving_api(params_path.parent, port) as api_url,
              temporary_settings({PREFECT_API_URL: api_url})):
            try:
                # One run at a time: another would only wait for the project's run lock.
                scheduled.serve(name=s.deployment, schedule=Cron(s.cron, timezone=s.timezone),
                                     parameters={"params_path": str(params_path), "until": until},
                                     limit=1)
            finally:
                signals.ignore_stop_signals()
                _end_flow_runs()  # while the API is up: they report their end to it
    except KeyboardInterrupt:
        pass  # a signal before the runner started: the server is stopped all the same


def _end_flow_runs(grace_seconds: float = 30.0) -> None:
    """End the flow runs the runner still has going: SIGTERM to each and all it started (Prefect
    marks the runs crashed), then SIGKILL for what is left. The runner leaves them running on
    SIGTERM, and one whose API has gone hangs at exit: nothing outlives `bertflow serve`."""
    import multiprocessing

    import psutil

    from pipeline.ops.watchdog import end

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
