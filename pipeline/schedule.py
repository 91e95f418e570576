"""Scheduled pipeline runs: `bertflow serve` serves a Prefect deployment of `scheduled_flow`
with the cron schedule of params.yaml (`schedule`).

Each run: `dvc pull` (when a default remote is set) -> the pipeline flow (DVC reruns only stale
stages, then new models challenge their champions) -> `dvc push`. A run in which nothing changed
skips every stage and registers nothing. Without PREFECT_API_URL the deployment lives in a
temporary local API for as long as `bertflow serve` runs; with it, on that Prefect server.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from components.core.config import load_params
from pipeline import versioning
from pipeline.flow import pipeline_flow


@flow(name="bertflow-scheduled")
def scheduled_flow(params_path: str = "params.yaml") -> dict:
    """Pull the data, run what is stale, update the registry, push the data."""
    logger = get_run_logger()
    root = Path(params_path).resolve().parent
    remote = versioning.is_dvc_project(root) and versioning.has_remote(root)
    if remote:
        try:
            versioning.pull(root)
        except Exception as e:  # noqa: BLE001 - the stages recompute what the remote lacks
            logger.warning("dvc pull: %s; stages whose outputs are missing will run", e)
    results = pipeline_flow(params_path, wait=True)  # after a run started by hand, if any
    pushed = versioning.push(root) if remote else 0
    logger.info("dvc push: %s files", pushed)
    registry = results.get("registry", {}).get("stats", {})
    return {"ran": [n for n, r in results.items() if r["status"] == "ran" and n != "registry"],
            "registered": registry.get("registered", 0), "pushed": pushed}


def serve(params_path: Path) -> None:
    """Serve the deployment (blocks; Ctrl-C stops it)."""
    from prefect.schedules import Cron

    params_path = Path(params_path).resolve()
    s = load_params(params_path).schedule
    scheduled_flow.serve(name=s.deployment, schedule=Cron(s.cron, timezone=s.timezone),
                         parameters={"params_path": str(params_path)})
