"""Reproducibility and crash recovery on a small real project.

One project is run straight through (`bertflow run`) as the reference; each of its stages rerun
on unchanged inputs must write the same bytes. A second, identical project has every stage
killed once (SIGKILL, by its pid: the project lock's watchdog ends whatever the command started)
at a random point, and rerun: each stage as `bertflow stage NAME` (what dvc.yaml runs), the
registry step inside a `bertflow run`. At the end it must hold exactly the reference's outputs,
byte for byte (determinism across projects, and of a stage rerun over what a kill left), and
one registry version per model.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, POOL, make_task_project, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
# One task: a second would run the same stage code again.
TASKS = {"ner": {"kind": "token", "source": "data/user/tasks/ner.conll"}}
DONE = re.compile(r"stage (\S+): ran in ([\d.]+) s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[str, float]]:
    """The project run straight through, and how long each of its stages took: a stage its own
    work (`this_run.seconds` of its MLflow run), the registry step as the flow logs it."""
    repo = make_task_project(tmp_path_factory.mktemp("reference") / "project", TASKS, **POOL)
    out = run_cli("bertflow", "run", cwd=repo)
    seconds = {m[1]: float(m[2]) for m in DONE.finditer(out.stdout + out.stderr)}
    assert "pretrain" in seconds and "registry" in seconds, out.stderr[-3000:]
    return repo, {**seconds, **stage_seconds(repo)}


def stage_seconds(repo: Path) -> dict[str, float]:
    """Each stage's own work in seconds, from the first MLflow run that ran it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id],
                              "tags.`bertflow.status` = 'ran'", order_by=["attributes.start_time DESC"])
    return {r.data.tags["bertflow.stage"]: r.data.metrics["this_run.seconds"] for r in runs
            if "bertflow.stage" in r.data.tags and "this_run.seconds" in r.data.metrics}


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
    # The project's one start: a stage per task and start; adapt, teacher, transfer_set and
    # distill exist only with their start.
    per_task = ("task_data", "finetune", "evaluate")
    assert set(stages) == {"ingest", "clean", "checkpoint", "tokenizer", "pairs", "pretrain",
                           "transfer"} | {f"{s}@{t}" + ("-pretrained" if s == "finetune" else "")
                                          for s in per_task for t in TASKS}, stages
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


def test_killed_in_every_stage_and_rerun_ends_exactly_like_a_straight_run(reference, tmp_path):
    from components.core.params import load_params
    from pipeline import deps, versioning
    from pipeline.stages import plan

    ref, seconds = reference
    seed = int(os.environ.get("BERTFLOW_KILL_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    repo = make_task_project(tmp_path / "project", TASKS, **POOL)
    deps.write(repo / "params.yaml", repo / "dvc.yaml")  # the task's stages, as `bertflow run` adds them
    snapshots = repo / "data" / "models" / "pretrain-snapshots"
    killed: dict[str, float] = {}  # where each was killed: seconds after it started
    resumable = False
    for stage in plan(load_params(repo / "params.yaml")):
        if stage == "pretrain":  # soon after its first snapshot, before the export removes them
            ready = lambda: bool(list(snapshots.glob("*/last.ckpt")))  # noqa: E731
            killed[stage] = kill(repo, ["stage", stage], rng, 0.05 * seconds[stage], tmp_path, ready=ready)
            resumable = ready()
        else:
            killed[stage] = kill(repo, ["stage", stage], rng, 0.9 * seconds[stage], tmp_path)
        # The rerun first recovers whatever the kill left, then writes the stage's outputs.
        run_cli("bertflow", "stage", stage, cwd=repo)
        versioning.commit(repo, stage)  # into dvc.lock, as the flow records a stage it ran
    where = f"(kill seed {seed}; killed after: {killed})"
    assert resumed(repo) is resumable, where  # from the snapshot left by the kill
    # The registry step: a whole run, every stage up to date, killed while it registers.
    killed["registry"] = kill(repo, ["run"], rng, 0.8 * seconds["registry"], tmp_path,
                              logged="stage registry: running")

    final = run_cli("bertflow", "run", cwd=repo)
    assert {m[1] for m in DONE.finditer(final.stderr)} <= {"registry"}, final.stderr[-3000:]  # all recorded
    assert not list(repo.glob("data/**/.*.tmp-*")), where  # no partial output left
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


def kill(repo: Path, args: list[str], rng: random.Random, within: float, logs: Path,
         ready: Callable[[], bool] | None = None, logged: str = "") -> float:
    """`bertflow ARGS`, SIGKILLed by its pid at a random point of its first `within` seconds,
    counted from when it holds the project lock (and has logged `logged`, and `ready()` holds).
    One that ends first ran faster than the reference: it is run again and killed within the
    time it took (three tries). Returns the second it was killed at."""
    for attempt in range(3):
        delay = rng.uniform(0.05, 1.0) * within
        command = Forked(repo, args, logs / f"{'-'.join(args)}.{attempt}.log")
        started = command.started(logged, ready)
        if command.kill_after(delay):
            return delay
        within = time.monotonic() - started
    raise AssertionError(f"bertflow {' '.join(args)} ended before each of three kills")


class Forked:
    """`bertflow ARGS` in `repo`, forked by this test process's fork server as run_cli runs it
    (a fresh interpreter's imports would cost each kill ~10 s), on a thread; stderr in `log`."""

    def __init__(self, repo: Path, args: list[str], log: Path) -> None:
        from tests.conftest import _fork_server  # the test process's one server, shared with run_cli

        self.server, self.repo, self.log = _fork_server(), repo, log
        self.code: int | None = None
        self.process = None  # a psutil.Process once known: a pid reused later is not it
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        self.thread = threading.Thread(target=self._run, args=(args, env), daemon=True)
        self.thread.start()

    def _run(self, args: list[str], env: dict[str, str]) -> None:
        self.code = self.server.run(args, self.repo.resolve(), env, self.log.with_suffix(".out"), self.log)

    def started(self, logged: str = "", ready: Callable[[], bool] | None = None) -> float:
        """When the command held the project lock, had logged `logged` and `ready()` held (as
        time.monotonic()); its process is known from then on, unless it had ended."""
        import psutil

        from pipeline.ops.lock import holder, lock_path

        server = psutil.Process(self.server.proc.pid)
        deadline = time.monotonic() + 600
        while self.process is None and self.thread.is_alive() and time.monotonic() < deadline:
            pid = holder(self.repo)[0] if lock_path(self.repo).exists() else ""
            # the lock's note names it, and the fork server started it (not an earlier holder)
            mine = [p for p in server.children() if str(p.pid) == pid]
            if mine:
                self.process = mine[0]
            else:
                time.sleep(0.02)
        while self.thread.is_alive() and time.monotonic() < deadline and not (
                logged in self.stderr() and (ready is None or ready())):
            time.sleep(0.01)
        assert self.process is not None or self.code == 0, f"never started:\n{self.tail()}"
        return time.monotonic()

    def kill_after(self, delay: float) -> bool:
        """SIGKILL the command `delay` s from now; False if it had ended by then."""
        import psutil

        time.sleep(delay)
        if self.process is not None and self.thread.is_alive():
            with contextlib.suppress(psutil.NoSuchProcess):  # it has just ended
                self.process.send_signal(signal.SIGKILL)
        self.thread.join()
        assert self.code in (0, -signal.SIGKILL), f"exit code {self.code}:\n{self.tail()}"
        return self.code == -signal.SIGKILL

    def stderr(self) -> str:
        """The command's stderr so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self) -> str:
        """The end of the command's stderr, for a failure's message."""
        return self.stderr()[-3000:]


STORE_USER = """
from pathlib import Path
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # imported before the kills
from components.core import tracking
from components.core.params import load_params
p = load_params(Path("params.yaml"))
print("ready", flush=True)
tracking.client(p.tracking, Path.cwd()).search_experiments()
"""


def test_a_kill_while_a_new_mlflow_store_is_made_leaves_none_and_the_next_command_makes_it(tmp_path):
    # MLflow migrates a new store in place (~2 s): a kill part way could leave tables made and
    # their migration unrecorded, and every later command failed ("table registered_models
    # already exists"). The store is made aside and appears whole: killed while it is being
    # made (its first bytes written), there is none.
    import subprocess
    import sys

    from components.core import tracking
    from components.core.params import load_params
    from tests.conftest import small_params, write_params

    p = load_params(write_params(tmp_path, small_params()))
    proc = subprocess.Popen([sys.executable, "-c", STORE_USER], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    while not any(f.stat().st_size for f in tmp_path.glob("*mlflow.db*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    assert not (tmp_path / "mlflow.db").exists()
    tracking.client(p.tracking, tmp_path).search_experiments()
    assert (tmp_path / "mlflow.db").exists()
