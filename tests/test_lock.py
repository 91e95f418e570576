"""One pipeline command at a time per project: a second run or stage is refused or waits; a
killed run never leaves the project locked, nor any process of its own running."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.core.errors import BertflowError
from pipeline.ops.lock import holder, lock_path, project_lock, under_lock
from tests.conftest import BIN, ROOT, run_cli, section

pytestmark = pytest.mark.usefixtures("prefect_api")  # one Prefect server for the runs


def _holder(root: Path, then: str = "") -> subprocess.Popen:
    """A process that takes `root`'s lock, runs the Python statement `then`, and, once it has
    said so on its stdout, holds the lock for ten minutes."""
    proc = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; sys.path.insert(0, sys.argv[1]);"
        "from pipeline.ops.lock import project_lock\n"
        "with project_lock(__import__('pathlib').Path(sys.argv[2])):\n"
        f"    {then or 'pass'}\n"
        "    print('locked', flush=True); time.sleep(600)"),
        str(ROOT), str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.slow
def test_a_second_run_is_refused_while_the_first_holds_the_lock(dvc_project):
    with project_lock(dvc_project):
        with pytest.raises(BertflowError, match=f"another bertflow run \\(pid {os.getpid()}\\)"):
            with project_lock(dvc_project):
                pass
        refused = run_cli("bertflow", "run", "--until", "ingest", cwd=dvc_project, check=False)
        assert refused.returncode == 1
        assert f"another bertflow run (pid {os.getpid()})" in refused.stderr and "--wait" in refused.stderr
        assert not (dvc_project / "data" / "raw").exists()  # nothing ran


@pytest.mark.slow
def test_a_killed_holder_releases_the_lock_and_a_waiting_run_goes_on(tmp_path):
    locker = _holder(tmp_path)
    assert holder(tmp_path) == (str(locker.pid), "bertflow run")
    with pytest.raises(BertflowError):
        with project_lock(tmp_path):
            pass
    locker.send_signal(signal.SIGKILL)
    with project_lock(tmp_path, wait=True, poll_seconds=0.1):  # waits for the kill, then holds it
        assert holder(tmp_path)[0] == str(os.getpid())
    locker.wait()


@pytest.mark.slow
def test_two_runs_at_once_one_refused_one_waiting_and_nothing_corrupts(dvc_project):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(["bertflow", "run", "--until", "pairs", *args], cwd=dvc_project,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first = start()
    deadline = time.time() + 300
    while not lock_path(dvc_project).exists() or not lock_path(dvc_project).read_text():
        assert time.time() < deadline and first.poll() is None
        time.sleep(0.05)
    refused, waiting = start(), start("--wait")
    outputs = {name: proc.communicate(timeout=900) for name, proc in
               (("refused", refused), ("first", first), ("waiting", waiting))}
    assert refused.returncode == 1
    assert f"another bertflow run (pid {first.pid}) is running" in outputs["refused"][0]
    assert first.returncode == 0 and waiting.returncode == 0, outputs
    # The waiting run found the first one's work done and complete: it skipped every stage.
    for stage in ("ingest", "clean", "tokenizer", "pairs"):
        assert f"stage {stage}: up to date, skipped" in outputs["waiting"][0]
    status = run_cli("dvc", "status", "pairs", "--json", cwd=dvc_project).stdout
    assert json.loads(status) == {}


@pytest.mark.slow
def test_a_stage_is_refused_beside_a_run_and_runs_under_the_lock_of_its_caller(dvc_project, tmp_path):
    # `dvc repro` beside a run: its `bertflow stage` is refused in one line, nothing written.
    locker = _holder(dvc_project)
    try:
        refused = run_cli("bertflow", "stage", "ingest", cwd=dvc_project, check=False)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"error: another bertflow run (pid {locker.pid}) is running in {dvc_project}; wait for it "
            "to finish, or run with --wait"]
        assert not (dvc_project / "data" / "raw").exists()
    finally:
        locker.kill()
        locker.wait()
    # A stage the holder starts under its lock (as the flow starts pretraining) runs; started
    # without it, it is refused even as the holder's child.
    with project_lock(dvc_project, what="bertflow stage clean"):
        assert holder(dvc_project)[1] == "bertflow stage clean"
        refused = run_cli("bertflow", "stage", "ingest", cwd=dvc_project, check=False)
        assert "another bertflow stage clean" in refused.stderr and refused.returncode == 1
        run_cli("bertflow", "stage", "ingest", cwd=dvc_project, env=under_lock(dvc_project))
    assert (dvc_project / "data" / "raw").is_dir()


def _descendants(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def _left_running(procs: list, settle_seconds: float = 5.0) -> list[str]:
    """The command lines of `procs` still running. A process in the last moment of its exit has
    already released its memory (an empty command line) but is not yet a zombie: such ones get
    `settle_seconds` to finish."""
    import psutil

    def running() -> list[str | None]:
        out = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(" ".join(p.cmdline()) or None)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.time() + settle_seconds
    while (left := running()) and not any(left) and time.time() < deadline:
        time.sleep(0.1)
    return [cmd or "(exiting)" for cmd in left]


def test_a_killed_holder_leaves_no_process_behind_and_the_lock_holds_until_they_are_gone(tmp_path):
    import psutil

    # A lock holder with a child and a grandchild (a stage process and its DDP rank, say).
    locker = _holder(tmp_path, then="subprocess.Popen(['sh', '-c', 'sleep 600 & sleep 600'])")
    deadline = time.time() + 30
    while len([p for p in _descendants(locker.pid) if p.name() == "sleep"]) < 2:
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(1.5)  # the watchdog has looked at least once since
    started = [p for p in _descendants(locker.pid) if "pipeline.ops.watchdog" not in " ".join(p.cmdline())]
    assert len(started) == 3, started  # sh and its two sleeps
    os.kill(locker.pid, signal.SIGKILL)  # its pid alone, as `kill -9 PID` does
    locker.wait()
    with project_lock(tmp_path, wait=True, poll_seconds=0.05):  # once the watchdog lets go ...
        assert not _left_running(started)
    _, alive = psutil.wait_procs(started, timeout=5)
    assert not alive


def test_a_holder_that_ends_normally_stops_its_watchdog_and_frees_the_lock(tmp_path):
    import psutil

    with project_lock(tmp_path):
        watchdogs = [p for p in _descendants(os.getpid()) if "pipeline.ops.watchdog" in " ".join(p.cmdline())]
        assert len(watchdogs) == 1
        with pytest.raises(BertflowError, match="another bertflow run"):
            with project_lock(tmp_path):  # the watchdog's copy of the lock is the same lock
                pass
    assert not watchdogs[0].is_running() or watchdogs[0].status() == psutil.STATUS_ZOMBIE
    with project_lock(tmp_path):
        pass


def _pretrain_run_open(db: Path) -> bool:
    """Whether the pretrain stage has opened its MLflow run (it is setting up or training)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            return bool(con.execute("select 1 from tags where key = 'bertflow.stage' and "
                                    "value = 'pretrain'").fetchone())
    except sqlite3.Error:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_a_killed_run_ends_its_pretraining_child_and_prefect_server(dvc_project, sig, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("PREFECT_API_URL")  # the default: the run starts a temporary server
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.Popen(["bertflow", "run"], cwd=dvc_project, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 600
    for line in run.stderr:  # the default 4,921 steps: it is still pretraining when killed
        assert time.time() < deadline
        if "stage pretrain: running" in line:
            break
    # As soon as the stage has opened its MLflow run: a SIGTERM during its setup must end it too.
    while not _pretrain_run_open(dvc_project / "mlflow.db"):
        assert time.time() < deadline and run.poll() is None
        time.sleep(0.1)
    started = [p for p in _descendants(run.pid) if "pipeline.ops.watchdog" not in " ".join(p.cmdline())]
    assert any("uvicorn" in " ".join(p.cmdline()) for p in started)  # Prefect's temporary server
    os.kill(run.pid, sig)  # the run's pid alone, not its process group
    err = run.stderr.read()
    assert run.wait(timeout=300) == (-sig if sig == signal.SIGKILL else 128 + sig), err[-3000:]
    with project_lock(dvc_project, wait=True, poll_seconds=0.1):
        assert not _left_running(started)
    client = MlflowClient(f"sqlite:///{dvc_project / 'mlflow.db'}")

    def status() -> dict[str, str]:
        runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
        return {r.data.tags.get("bertflow.stage", "flow"): r.info.status for r in runs}

    if sig == signal.SIGTERM:  # ended as a failure: the flow's run and the stage's, not RUNNING
        assert "error: stage pretrain: terminated by SIGTERM" in err
        assert status()["flow"] == status()["pretrain"] == "FAILED", status()
        return
    assert status()["flow"] == "RUNNING"  # nobody left to close it ...
    subprocess.run(["bertflow", "stage", "ingest"], cwd=dvc_project, env=env, check=True,
                   capture_output=True)
    assert status()["flow"] == "KILLED" and "RUNNING" not in status().values(), status()  # ... until the next


@pytest.mark.slow
def test_a_command_started_while_the_watchdog_cleans_up_waits_instead_of_refusing(tmp_path):
    import psutil

    from pipeline.ops import watchdog

    # Its child ignores SIGTERM, so the clean-up takes the watchdog's whole grace period.
    locker = _holder(tmp_path, then="subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 600'])")
    deadline = time.time() + 30
    while not [p for p in _descendants(locker.pid) if p.name() == "sleep"]:
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(1.5)  # the watchdog has looked at least once since
    started = [p for p in _descendants(locker.pid) if "pipeline.ops.watchdog" not in " ".join(p.cmdline())]
    os.kill(locker.pid, signal.SIGKILL)
    locker.wait()
    while not holder(tmp_path)[1].startswith(watchdog.CLEANUP):
        assert time.time() < deadline
        time.sleep(0.01)
    begun = time.monotonic()
    with project_lock(tmp_path):  # no --wait: it waits for the clean-up all the same
        assert time.monotonic() - begun > watchdog.GRACE_SECONDS / 2
        assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _store():
    """The tracking section with a sqlite store in the project folder."""
    from components.core.config import TrackingConfig

    return section(TrackingConfig, uri="sqlite:///mlflow.db")


class _KillOnRead:
    """A tag value that sends this process SIGTERM when the run being opened reads it."""

    def __str__(self) -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        return "read"


def test_a_sigterm_while_a_run_is_being_opened_ends_that_run_failed(tmp_path):
    from mlflow.tracking import MlflowClient

    from components.core import tracking

    def terminated(signum, frame):  # what `bertflow stage` does on SIGTERM
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(SystemExit) as ended:
            with tracking.mlflow_run(_store(), tmp_path, "stage", tags={"note": _KillOnRead()}):
                pytest.fail("the body ran after a SIGTERM during the opening")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ended.value.code == 128 + signal.SIGTERM
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["note"] == "read"
    assert signal.getsignal(signal.SIGTERM) is previous


def _tracked(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Run Python `body` in a process of its own, `cfg` and `root` naming tmp_path's store."""
    cfg = _store().model_dump_json()
    return subprocess.run([sys.executable, "-c", (
        "import os, signal, sys, time; sys.path.insert(0, sys.argv[1])\n"
        "from pathlib import Path\n"
        "from components.core import tracking\n"
        "from components.core.config import TrackingConfig\n"
        "cfg, root = TrackingConfig.model_validate_json(sys.argv[3]), Path(sys.argv[2])\n" + body),
        str(ROOT), str(tmp_path), cfg], capture_output=True, text=True, timeout=120)


def _statuses(root: Path) -> dict[str, tuple[str, str | None]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("bertflow").experiment_id])
    return {r.info.run_name: (r.info.status, r.data.tags.get("bertflow.error")) for r in runs}


def test_a_sigterm_python_swallows_inside_a_destructor_still_ends_the_stage_failed(tmp_path):
    # The exit is raised inside __del__, where Python swallows it and goes on: the signal is
    # sent again, and the stage ends instead of training on for its minute.
    done = _tracked(tmp_path, (
        "from pipeline.ops.signals import ends_on_sigterm\n"
        "class SigtermWhenCollected:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(1)\n"
        "with ends_on_sigterm(), tracking.mlflow_run(cfg, root, 'stage'):\n"
        "    SigtermWhenCollected()\n"
        "    time.sleep(60)\n"))
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert _statuses(tmp_path)["stage"] == ("FAILED", "Terminated: terminated by SIGTERM")


def test_a_terminated_stage_exits_143_whatever_its_way_out_raises(tmp_path):
    # As when the workers the SIGTERM killed make torch or a process pool raise on the way out.
    done = _tracked(tmp_path, (
        "from pipeline.ops.signals import Terminated, ends_on_sigterm\n"
        "try:\n"
        "    with ends_on_sigterm(), tracking.mlflow_run(cfg, root, 'stage'):\n"
        "        try:\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            time.sleep(60)\n"
        "        finally:\n"
        "            raise RuntimeError('a worker it killed')\n"
        "except Terminated as e:\n"  # as `bertflow` says it
        "    print(f'error: {e}', file=sys.stderr)\n"
        "    raise\n"))
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert "on the way out: RuntimeError: a worker it killed" in done.stderr
    assert _statuses(tmp_path)["stage"] == ("FAILED", "RuntimeError: a worker it killed")


def test_runs_a_killed_process_left_open_are_failed_by_their_key(tmp_path):
    # What a flow does when a stage's process ends without closing its run (SIGKILL, OOM).
    done = _tracked(tmp_path, (
        "with tracking.mlflow_run(cfg, root, 'mine', key='k1'), "
        "tracking.mlflow_run(cfg, root, 'other', key='k2'):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"))
    assert done.returncode == -signal.SIGKILL
    from components.core import tracking

    assert len(tracking.fail_left_open(_store(), tmp_path, "k1", "its process ended")) == 1
    assert _statuses(tmp_path) == {"mine": ("FAILED", "its process ended"), "other": ("RUNNING", None)}
    assert tracking.fail_left_open(_store(), tmp_path, "k1", "again") == []  # closed runs stay as they are
