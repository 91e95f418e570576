"""The Prefect flow: one task per stage in DAG order, DVC deciding what is stale.

Each task asks DVC whether its stage is stale; if so it runs the same `run_stage` that
`dvc repro` runs and records the result with `dvc commit`. A flow run therefore leaves dvc.lock,
the cache and the outputs exactly as `dvc repro` would, and a second run skips every stage.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from components.core import progress, tracking
from components.core.errors import BertflowError
from components.core.io import flatten
from components.core.params import load_params
from pipeline import deps, pipelines, presets, versioning
from pipeline.ops import signals
from pipeline.ops.redaction import masks_errors
from pipeline.placement import Ledger, Needs
from pipeline.run_plan import run_plan
from pipeline.stages import (
    PARENT_RUN_ENV,
    RUN_KEY_ENV,
    held,
    metrics_file,
    plan,
    record_skipped,
    run_stage,
    split_name,
)

# Worth a retry: the machine or a service hiccuped (a lost connection or worker, a locked
# database). Bad data, bad params, missing files and bugs are not: they would fail again.
_TRANSIENT = (OSError, BrokenProcessPool)
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
              FileExistsError)
_TRANSIENT_NAMES = {"OperationalError", "CommClosedError"}  # sqlite/SQLAlchemy locks, Dask comms


def _retry_transient(task, task_run, state) -> bool:
    """Prefect's retry_condition_fn: retry only transient infrastructure failures."""
    try:
        state.result()
    except BertflowError:
        return False
    except Exception as e:  # noqa: BLE001 - classifying, not handling
        if isinstance(e, _PERMANENT):
            return False
        return isinstance(e, _TRANSIENT) or type(e).__name__ in _TRANSIENT_NAMES
    return False


@task(retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_transient)
@masks_errors
def stage_task(name: str, params_path: str, parent_run_id: str, address: str | None,
               stale: bool | None = None, beside_others: bool = False) -> dict:
    """Run one stage if DVC says it is stale, and record it in its pipeline's dvc.lock; else
    record the skip. `address`: how DVC names the stage (`name`, or a preset pipeline's
    `presets/NAME/dvc.yaml:stage__item`); None outside a DVC project, where every stage runs.
    `stale`: DVC's answer where the flow knows it without asking again (None: ask).
    `beside_others`: other stages may run at once, so it runs in a process of its own."""
    from prefect.runtime import task_run

    logger = get_run_logger()
    root = Path(params_path).parent
    start = time.perf_counter()
    if signals.received():  # the next stage of a group, after a SIGTERM
        raise signals.Terminated(f"stage {name}: not started, the run was terminated by SIGTERM")
    p = load_params(params_path)
    if address and not (versioning.is_stale(root, address) if stale is None else stale):
        logger.info("stage %s: up to date, skipped", name)
        stats = record_skipped(name, Path(params_path), parent_run_id)
        status = "skipped"
    else:
        logger.info("stage %s: running", name)
        key = str(task_run.id)  # the same for every retry of this task run: one MLflow run
        if beside_others or split_name(name)[0].own_process:
            stats = _run_in_own_process(name, params_path, parent_run_id, key)
        else:
            stats = run_stage(name, Path(params_path), parent_run_id, key, p)
        if address:
            versioning.commit(root, address)
            # Lineage: the deps' hashes DVC has just recorded (hashed once, not also at the start).
            tracking.tag_attempt(p.tracking, root, key, versioning.recorded_dep_hashes(root, address))
        logger.info("stage %s: ran in %.1f s", name, time.perf_counter() - start)
        status = "ran"
    return {"status": status, "seconds": time.perf_counter() - start, "stats": stats}


@task(retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_transient)
@masks_errors
def registry_task(params_path: str, tasks: list[str], parent_run_id: str) -> dict:
    """Register the encoder and the evaluated task models; new ones challenge their champion.
    A retry registers nothing twice: versions are found by content hash, and one left
    unchallenged by the failed attempt is finished."""
    from prefect.runtime import task_run

    from pipeline.publish import publish

    logger = get_run_logger()
    logger.info("stage registry: running")
    start = time.perf_counter()
    outcome = publish(Path(params_path), tasks, parent_run_id, run_key=str(task_run.id))
    new = {name: r["version"] for name, r in outcome.items() if r["new"]}
    logger.info("stage registry: ran in %.1f s, registered %s", time.perf_counter() - start,
                ", ".join(f"{n} v{v}" for n, v in new.items()) or "nothing new")
    return {"status": "ran" if new else "skipped", "seconds": time.perf_counter() - start,
            "stats": {"registered": len(new), **{f"{n}.version": v for n, v in new.items()}}}


def _run_in_own_process(name: str, params_path: str, parent_run_id: str, key: str) -> dict:
    """`bertflow stage NAME` as a child process, its MLflow run nested under the flow's."""
    import os
    import sys

    from components.core.io import read_json
    from pipeline.ops.lock import under_lock

    env = {**os.environ, PARENT_RUN_ENV: parent_run_id, RUN_KEY_ENV: key,
           **under_lock(Path(params_path).parent)}
    cmd = [sys.executable, "-m", "pipeline.cli", "stage", name, "--params", params_path]
    lines: list[str] = []
    with (subprocess.Popen(cmd, env=env, cwd=Path(params_path).parent, stderr=subprocess.PIPE,
                           text=True) as proc, signals.forwarded_to(proc)):
        try:
            for line in proc.stderr:  # pass the stage's log through, keep its end for errors
                if progress.MARK in line:  # its progress lines go to the run log (and the console)
                    get_run_logger().info(line[line.index(progress.MARK) + 2:].rstrip())
                else:
                    sys.stderr.write(line)
                lines = [*lines[-49:], line.rstrip()]
        except BaseException:  # interrupted: the stage ends too, not after its last step
            proc.terminate()
            raise
    p = load_params(params_path)
    if proc.returncode != 0:  # its MLflow run is not left RUNNING, whatever ended it
        try:
            tracking.fail_left_open(p.tracking, Path(params_path).parent, key,
                                    f"its process ended with exit {proc.returncode} without closing it")
        except Exception as e:  # noqa: BLE001 - the stage's own failure is the one to report
            get_run_logger().warning("stage %s: its MLflow run could not be closed: %s", name, e)
    if signals.received():
        raise signals.Terminated(f"stage {name}: terminated by SIGTERM (exit {proc.returncode})")
    if proc.returncode != 0:
        message = next((ln[len("error: "):] for ln in reversed(lines) if ln.startswith("error: ")),
                       None)
        if message:  # a clear error from the stage: bad data or params, not worth a retry
            raise BertflowError(message)
        raise RuntimeError(f"stage {name} failed (exit {proc.returncode}):\n" + "\n".join(lines[-20:]))
    return read_json(metrics_file(p, Path(params_path).parent, name))


HEADLINE = ("documents", "documents_out", "sentences_out", "vocab_size", "unk_rate",
            "tokens_per_word", "train.instances", "train.nsp_random_fraction",
            "train.sop_swapped_fraction", "mlm_accuracy", "examples.train", "train_examples",
            "primary.pretrained.mean", "primary.scratch.mean")


def summary_markdown(results: dict[str, dict], failed: str | None = None) -> str:
    """A Markdown table of the run: each stage's status, time and headline numbers."""
    lines = ["| stage | status | seconds | key stats |", "|---|---|---|---|"]
    for name, r in results.items():
        flat = flatten(r["stats"])
        key = ", ".join(f"{k}={flat[k]:.4g}" if isinstance(flat[k], float) else f"{k}={flat[k]}"
                        for k in HEADLINE if k in flat)
        lines.append(f"| {name} | {r['status']} | {r['seconds']:.1f} | {key} |")
    if failed:
        lines.append(f"| {failed} | failed | | |")
    pretrain = results.get("pretrain", {}).get("stats", {})
    if pretrain.get("stopped_by") == "max_minutes":
        lines.append(f"\n**Warning: pretrain.max_minutes stopped pretraining at step "
                     f"{pretrain['steps']} of {pretrain['max_steps']}: not a reference run.**")
    return "\n".join(lines)


MAX_STAGES = 64  # executor.stages' bound: threads of the flow's task runner


def run_ready(names: list[str], upstream: dict[str, set[str]], submit, results: dict[str, dict],
              at_once: int, ledger: Ledger, needs: dict[str, Needs]) -> dict[str, PrefectFuture]:
    """Run the stages `names` (in run order) as their inputs become ready: up to `at_once` at a
    time, each when the ledger has what it holds free (`needs`); the first ready in run order
    first. `submit(name, beside_others)` starts one. A failed stage's dependants do not run;
    the others do. Fills `results` and returns the failed stages' futures, in run order."""
    pending, running, failed, dropped = list(names), {}, {}, set()
    while pending or running:
        for name in list(pending):
            if len(running) >= at_once:
                break
            if upstream[name] & (failed.keys() | dropped):
                pending.remove(name)  # it reads a failed stage's outputs: not run
                dropped.add(name)
            elif upstream[name] <= results.keys() and ledger.take(needs[name]):
                pending.remove(name)
                running[submit(name, at_once > 1)] = name
        if not running:
            break
        done = next(as_completed(list(running)))
        name = running.pop(done)
        ledger.give(needs[name])
        try:  # (its state may not say so yet: the result waits for it)
            results[name] = done.result()
        except Exception:  # noqa: BLE001 - raised again, in run order, by the caller
            failed[name] = done
    return {n: failed[n] for n in names if n in failed}


# Stages run in this process's threads, as many at once as executor.stages and the ledger of
# what they hold allow (run_ready decides: the runner only lends the threads); each stage is
# recorded in its dvc.lock under versioning's lock, one writer at a time.
@flow(name="bertflow", task_runner=ThreadPoolTaskRunner(max_workers=MAX_STAGES))
@masks_errors
def pipeline_flow(params_path: str = "params.yaml", until: str | None = None,
                  wait: bool = False) -> dict[str, dict]:
    """The pipeline: every stage up to `until`, skipping what DVC finds up to date; then the
    registry step for the tasks evaluated (see pipeline.publish). One run at a time per
    project: with another running, wait for it (`wait`) or refuse."""
    from components.core.logs import plain_user_errors_on_consoles
    from pipeline.ops.lock import project_lock

    plain_user_errors_on_consoles("prefect", "prefect.flow_runs", "prefect.task_runs")
    # SIGTERM goes to the running stage's process, which ends as a failure (its MLflow run FAILED,
    # its temp outputs removed); the flow fails with it, and Prefect's server is stopped on the
    # way out. With no stage process running it stops the flow at once. Installed inside the
    # flow run because Prefect's own handler, set at its start, waits for the running stage.
    with (project_lock(Path(params_path).resolve().parent, wait),
          signals.ends_on_sigterm(kill_children=False)):
        return _pipeline(params_path, until)


def _pipeline(params_path: str, until: str | None) -> dict[str, dict]:
    """The body of pipeline_flow, under the project lock."""
    from prefect.artifacts import create_markdown_artifact

    logger = get_run_logger()
    path = Path(params_path).resolve()
    root = path.parent
    p = load_params(path)
    # In a DVC project DVC keeps the books of every run: params.yaml's pipeline (dvc.yaml) and a
    # preset's (presets/NAME/dvc.yaml, its own stages; the others are its base's, pipeline.presets).
    kept = versioning.is_dvc_project(root)
    for lock in versioning.recover_locks(root) if kept else []:
        logger.warning("%s: the last run was killed while recording a stage; restored it as it was "
                       "before, so that stage runs again", lock)
    if kept and versioning.recover_rwlock(root):
        logger.warning("DVC's stage-lock table (.dvc/tmp/rwlock) was cut short by a killed run; "
                       "removed it (DVC starts a new one)")
    if kept and deps.write(root / "params.yaml", root / "dvc.yaml"):  # a task or a source added or moved
        logger.warning("dvc.yaml: brought up to date with params.yaml and the code (commit it with dvc.lock)")
    owners = presets.owners(path, until) if kept else dict.fromkeys(plan(p, until), path)
    for preset in dict.fromkeys(o for o in owners.values() if pipelines.is_preset(o)):
        if presets.write(preset):
            logger.warning("%s: the pipeline of %s brought up to date (commit it with its dvc.lock)",
                           pipelines.pipeline_file(preset).relative_to(root), preset.name)
    if not kept:
        logger.warning("%s is not in a DVC project: every stage runs, and no books are kept", root)
    if dead := tracking.close_dead_runs(p.tracking, root):
        logger.warning("MLflow: marked %d runs of a killed earlier run KILLED (they were left RUNNING)",
                       len(dead))
    results: dict[str, dict] = {}
    run = run_plan(root, owners, kept)
    names, address = run.names, run.address

    # DVC's answer for each stage, asked once (run.stale): up to date, a stage still is until a
    # stage it reads runs; never recorded in its dvc.lock, it stays stale until it runs.
    def known_stale(name: str, ran_before: bool) -> bool | None:
        if not kept:
            return True
        if not versioning.recorded(root, address[name]):
            return True
        if address[name] not in run.stale and not ran_before:
            return False
        return None

    current = None
    try:
        with tracking.mlflow_run(p.tracking, root, "pipeline",
                          tags={"bertflow.flow": "pipeline", **tracking.git_state(root)}) as parent:
            parent.log_params({"until": until or "all", "params_file": str(path)})
            def submit(name: str, beside_others: bool) -> PrefectFuture:
                ran_before = any(results[d]["status"] == "ran" for d in run.upstream[name])
                return stage_task.submit(name, str(owners[name]), parent.run_id, address[name],
                                         known_stale(name, ran_before), beside_others)

            needs = {n: held(run.params_of(n), n) for n in names}
            failed = run_ready(names, run.upstream, submit, results, p.executor.stages,
                               Ledger.of_this_machine(), needs)
            results.update({n: results.pop(n) for n in names if n in results})  # in run order
            for current, future in failed.items():  # noqa: B007 - `current` names a failure
                future.result()  # raises the first failure, in run order
            current = None
            evaluated = [n.partition("@")[2] for n in results if n.startswith("evaluate@")]
            if evaluated:
                current = "registry"
                results["registry"] = registry_task(str(path), evaluated, parent.run_id)
                current = None
            parent.log_metrics({f"{n}.seconds": r["seconds"] for n, r in results.items()})
            parent.set_tags({f"stage.{n}": r["status"] for n, r in results.items()})
    finally:
        create_markdown_artifact(summary_markdown(results, failed=current),
                                 key="bertflow-run-summary",
                                 description="Stages run, skipped or failed, with headline stats")
    return results


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
