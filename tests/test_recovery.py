"""Reproducibility and crash recovery on a small real project.

One project is run straight through (`bertflow run`) as the reference; each of its stages rerun
on unchanged inputs must write the same bytes. A second, identical project is killed (SIGKILL,
the whole process group) once inside every stage, at a random point, and rerun each time: at the
end it must hold exactly the reference's outputs, byte for byte (determinism across projects,
and of a run resumed from what a kill left).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, POOL, make_task_project, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
# One task: a second would run the same stage code again, and every kill costs the suite a
# pipeline start (each `bertflow run` imports Prefect, MLflow, DVC and torch anew).
TASKS = {"ner": {"kind": "token", "source": "data/user/tasks/ner.conll"}}
KILLS = 3  # stages killed besides pretraining, of the 13 a run has
DONE = re.compile(r"stage (\S+): ran in ([\d.]+) s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[str, float]]:
    """The project run straight through, and how long each of its stages took."""
    repo = make_task_project(tmp_path_factory.mktemp("reference") / "project", TASKS, **POOL)
    out = run_cli("bertflow", "run", cwd=repo)
    seconds = {m[1]: float(m[2]) for m in DONE.finditer(out.stdout + out.stderr)}
    assert "pretrain" in seconds and "registry" in seconds, out.stderr[-3000:]
    return repo, seconds


def outputs(repo: Path) -> dict[str, str]:
    """Every DVC-tracked output of the project and its md5, from dvc.lock."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    return {o["path"]: o["md5"] for stage in lock.values() for o in stage["outs"]}


def assert_same_results(repo: Path, ref: Path) -> None:
    """Every DVC-tracked output, data, models and metrics files alike, byte-identical (its md5
    in dvc.lock): no output holds wall times or other facts of one execution."""
    assert outputs(repo) == outputs(ref)


def resumed(repo: Path) -> bool:
    """Whether the last pretrain stage run resumed from a snapshot (its MLflow run says)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id],
                              "tags.`bertflow.stage` = 'pretrain' and tags.`bertflow.status` = 'ran'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].data.metrics["this_run.resumed"] == 1


def test_every_stage_rerun_on_unchanged_inputs_writes_the_same_bytes(reference):
    ref, _ = reference
    stages = list(yaml.safe_load((ref / "dvc.lock").read_text())["stages"])
    per_task = ("task_data", "adapt", "teacher", "transfer_set", "finetune", "evaluate")
    assert set(stages) == {"ingest", "clean", "checkpoint", "tokenizer", "pairs", "pretrain",
                           "transfer"} | {f"{s}@{t}" for s in per_task for t in TASKS}, stages
    assert len(outputs(ref)) > 10
    from pipeline.stages import run_stage

    encoder = ref / "data" / "models" / "encoder" / "bertflow.json"
    written = encoder.stat().st_mtime_ns
    for stage in stages:  # what `bertflow stage NAME` runs, in this process (no start-up each)
        run_stage(stage, ref / "params.yaml")
    assert encoder.stat().st_mtime_ns > written  # really written again
    # DVC finds every output as dvc.lock hashed it, nothing stale: no wall time or host detail
    # in any output.
    status = run_cli("dvc", "status", "--json", cwd=ref).stdout
    assert json.loads(status) == {}, status


def test_killed_in_any_stage_and_rerun_ends_exactly_like_a_straight_run(reference, tmp_path):
    # Pretraining (its resume path) and KILLS other stages drawn by the seed, in pipeline order:
    # a kill costs a whole `bertflow run` start, and across runs the seeds reach every stage.
    ref, seconds = reference
    seed = int(os.environ.get("BERTFLOW_KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    drawn = {"pretrain", *rng.sample([s for s in seconds if s != "pretrain"], KILLS)}
    repo = make_task_project(tmp_path / "project", TASKS, **POOL)
    checkpoints = repo / "data" / "models" / "pretrain-snapshots"
    killed, resumable = {}, False
    for stage in [s for s in seconds if s in drawn]:
        # The rerun first recovers whatever the previous kill left, then starts `stage`.
        ready = (lambda: list(checkpoints.glob("*/last.ckpt"))) if stage == "pretrain" else None
        # Pretraining: soon after its first checkpoint, before the export removes them.
        share = rng.uniform(0.0, 0.05) if ready else rng.uniform(0.05, 0.8)
        killed[stage] = kill_inside(repo, stage, share * seconds[stage], ready)
        resumable = resumable or (stage == "pretrain" and bool(ready()))
    where = f"(kill seed {seed}; killed: {killed})"
    assert sum(killed.values()) >= len(killed) - 2, where  # fast stages (checkpoint) may end first
    assert killed["pretrain"], where

    run_cli("bertflow", "run", cwd=repo)
    assert not list(repo.glob("data/**/.*.tmp-*")), where  # no partial output left
    assert resumed(repo) is resumable, where  # from the snapshot left by the kill
    assert_same_results(repo, ref)
    # Nothing was registered twice, and a registration cut short was finished: one version
    # per model, each task's its champion.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}",
                          registry_uri=f"sqlite:///{repo / 'mlflow.db'}")
    for name in [*TASKS, "encoder"]:
        assert len(client.search_model_versions(f"name='{name}'")) == 1, (name, where)
    for name in TASKS:
        assert client.get_model_version_by_alias(name, "champion").version in (1, "1"), where


def kill_inside(repo: Path, stage: str, delay: float, ready=None) -> bool:
    """`bertflow run --until STAGE` (the registry step: the whole run), SIGKILLed `delay` s
    after STAGE starts (after `ready()` holds, if given); False if it ended before the kill."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    until = [] if stage == "registry" else ["--until", stage]
    proc = subprocess.Popen(["bertflow", "run", *until], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    started = threading.Event()
    log: list[str] = []

    def watch() -> None:
        for line in proc.stderr:
            log.append(line)
            if f"stage {stage}: running" in line:
                started.set()

    threading.Thread(target=watch, daemon=True).start()
    deadline = time.time() + 600
    while not started.is_set() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert started.is_set(), f"{stage} never started:\n{''.join(log[-40:])}"
    while ready is not None and not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    alive = proc.poll() is None
    if alive:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert alive or proc.returncode == 0, f"{stage} failed before the kill:\n{''.join(log[-40:])}"
    return alive
