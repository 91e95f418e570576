"""One pipeline run at a time per project: a second is refused or waits; a killed run never
leaves the project locked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from components.core.errors import BertflowError
from pipeline.lock import lock_path, project_lock
from tests.conftest import BIN, ROOT, run_cli


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


def test_a_killed_holder_releases_the_lock_and_a_waiting_run_goes_on(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]);"
        "from pipeline.lock import project_lock\n"
        "with project_lock(__import__('pathlib').Path(sys.argv[2])):\n"
        "    print('locked', flush=True); time.sleep(600)"),
        str(ROOT), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    assert lock_path(tmp_path).read_text() == str(holder.pid)
    with pytest.raises(BertflowError):
        with project_lock(tmp_path):
            pass
    holder.send_signal(signal.SIGKILL)
    with project_lock(tmp_path, wait=True, poll_seconds=0.1):  # waits for the kill, then holds it
        assert lock_path(tmp_path).read_text() == str(os.getpid())
    holder.wait()


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
