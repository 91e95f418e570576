"""The Prefect flow: one task per stage in DAG order, DVC deciding what is stale.

Each task asks DVC whether its stage is stale; if so it runs the same `run_stage` that
`dvc repro` runs and records the result with `dvc commit`. A flow run therefore leaves dvc.lock,
the cache and the outputs exactly as `dvc repro` would, and a second run skips every stage.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger, task

from components.config import load_params
from components.errors import BertflowError
from pipeline import versioning
from pipeline.stages import STAGES, metrics_file, run_stage


def _retry_transient(task, task_run, state) -> bool:
    """Retry infrastructure hiccups (a locked database, a lost worker), not bad data or params."""
    try:
        state.result()
    except BertflowError:
        return False
    except Exception:
        return True
    return False


@task(retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_transient)
def stage_task(name: str, params_path: str, parent_run_id: str, tracked: bool) -> dict:
    """Run one stage if DVC says it is stale; record it in dvc.lock."""
    from components import tracking
    from components.io import read_json

    logger = get_run_logger()
    root = Path(params_path).parent
    start = time.perf_counter()
    if tracked and not versioning.is_stale(root, name):
        logger.info("stage %s: up to date, skipped", name)
        p = load_params(params_path)
        stats_path = metrics_file(p, root, name)
        stats = read_json(stats_path) if stats_path.exists() else {}
        with tracking.run(p.tracking, root, name, parent_run_id=parent_run_id,
                          tags={"bertflow.stage": name, "bertflow.status": "skipped"}) as run:
            run.log_metrics(stats)
        return {"status": "skipped", "seconds": time.perf_counter() - start, "stats": stats}
    stats = run_stage(name, Path(params_path), parent_run_id)
    if tracked:
        versioning.commit(root, name)
    logger.info("stage %s: ran in %.1f s", name, time.perf_counter() - start)
    return {"status": "ran", "seconds": time.perf_counter() - start, "stats": stats}


def stages_until(until: str | None) -> list[str]:
    """Stage names in DAG order, up to and including `until`."""
    names = list(STAGES)
    if until is None:
        return names
    if until not in STAGES:
        raise BertflowError(f"unknown stage {until!r} (stages: {', '.join(names)})")
    return names[: names.index(until) + 1]


def summary_markdown(results: dict[str, dict]) -> str:
    """A Markdown table of the run: each stage's status, time and headline numbers."""
    lines = ["| stage | status | seconds | key stats |", "|---|---|---|---|"]
    for name, r in results.items():
        flat = {k: v for k, v in r["stats"].items() if isinstance(v, int | float)}
        key = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in list(flat.items())[:6])
        lines.append(f"| {name} | {r['status']} | {r['seconds']:.1f} | {key} |")
    return "\n".join(lines)


@flow(name="bertflow", log_prints=True)
def pipeline_flow(params_path: str = "params.yaml", until: str | None = None) -> dict[str, dict]:
    """The pipeline: every stage up to `until`, skipping what DVC finds up to date."""
    from prefect.artifacts import create_markdown_artifact

    from components import tracking

    logger = get_run_logger()
    path = Path(params_path).resolve()
    root = path.parent
    p = load_params(path)
    tracked = versioning.is_dvc_project(root) and path == (root / "params.yaml").resolve()
    if not tracked:
        logger.warning("%s is not the params.yaml of a DVC project: running every stage without "
                       "DVC bookkeeping (use `dvc exp run -S key=value` to try other values)", path)
    results: dict[str, dict] = {}
    with tracking.run(p.tracking, root, "pipeline",
                      tags={"bertflow.flow": "pipeline", **tracking.git_state(root)}) as parent:
        parent.log_params({"until": until or "all", "params_file": str(path)})
        for name in stages_until(until):
            results[name] = stage_task(name, str(path), parent.run_id, tracked)
        parent.log_metrics({f"{n}.seconds": r["seconds"] for n, r in results.items()})
        parent.set_tags({f"stage.{n}": r["status"] for n, r in results.items()})
    create_markdown_artifact(summary_markdown(results), key="bertflow-run-summary",
                             description="Stages run or skipped, with their headline stats")
    return results
