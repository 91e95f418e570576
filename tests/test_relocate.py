"""A copied or moved project's MLflow store (real sqlite store, real registry, real artifacts):
refused while it points at the old folder, relocated by rewriting the old folder to the new one,
and then reading and writing the new folder only. The pipeline-level tests are in
tests/test_lifecycle.py."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from components.core import relocation, tracking
from components.core.config import TrackingConfig
from components.core.errors import BertflowError
from components.lifecycle import registry
from tests.conftest import section

CFG = section(TrackingConfig, uri="sqlite:///mlflow.db", artifacts="mlartifacts", experiment="t")


def _project(root: Path) -> Path:
    """A project folder whose store holds a run, an artifact and a champion model version."""
    model = root / "data" / "model"
    model.mkdir(parents=True)
    (model / "weights.bin").write_text("weights")
    with tracking.mlflow_run(CFG, root, "registry") as run:
        registry.register(run.client, run, "task", model, "model", registry.model_sha256(model),
                          {}, 0.9)
    return root


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """One project with a store (made once: a new store costs seconds), made from inside it as
    `bertflow` is run: experiment 0 gets the plain path ./mlruns/0 of the project."""
    root = tmp_path_factory.mktemp("made") / "a project"  # a space: locations are percent-encoded
    root.mkdir()
    with contextlib.chdir(root):
        return _project(root)


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under `folder`: its mtime and content hash."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, _sha256(p))
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stored(db: Path) -> list[str]:
    """Every artifact location the store keeps (used or not)."""
    with sqlite3.connect(db) as conn:
        return [v for table, column, _ in relocation.LOCATIONS
                for (v,) in conn.execute(f"SELECT {column} FROM {table}") if v]


def test_a_copy_is_refused_until_relocated_then_reads_and_writes_only_its_own_folder(made, tmp_path):
    import mlflow

    old = made
    before = snapshot(old)
    new = tmp_path / "copy"
    shutil.copytree(old, new)

    with pytest.raises(BertflowError) as refused:
        tracking.client(CFG, new)
    message = str(refused.value)
    assert "\n" not in message and "bertflow tracking relocate" in message
    assert f"keeps artifacts at {(old / 'mlartifacts').as_uri()}" in message

    done = tracking.relocate_store(CFG, new)
    assert list(done) == [old]
    assert done[old] == {"experiments.artifact_location": 2, "runs.artifact_uri": 1,
                         "model_versions.source": 1, "model_versions.storage_location": 1}
    assert not [v for v in _stored(new / "mlflow.db") if str(old) in v or old.as_uri() in v]
    assert tracking.relocate_store(CFG, new) == {}  # nothing left to do

    client = tracking.client(CFG, new)
    champion = client.get_model_version_by_alias("task", "champion")
    assert champion.source.startswith((new / "mlartifacts").as_uri() + "/")
    mlflow.set_tracking_uri(tracking.tracking_uri(CFG, new))
    local = mlflow.artifacts.download_artifacts(champion.source, dst_path=str(tmp_path / "got"))
    assert (Path(local) / "weights.bin").read_text() == "weights"
    with tracking.mlflow_run(CFG, new, "after") as run:
        run.log_artifact(new / "data" / "model", "later")
        written = Path(relocation.local_path(run.client.get_run(run.run_id).info.artifact_uri))
    assert written.is_relative_to(new) and (written / "later" / "weights.bin").exists()
    assert snapshot(old) == before  # the old folder: not a file changed, none added


def test_a_moved_project_is_relocated_from_the_files_it_holds(tmp_path):
    old = _project(tmp_path / "before")
    # Experiment 0, made with the store, keeps its artifacts in the project too (not in the
    # working directory's ./mlruns, as MLflow's own default would).
    assert all(relocation.local_path(v).is_relative_to(old) for v in _stored(old / "mlflow.db"))
    tracking.check_store(CFG, old)
    new = tmp_path / "elsewhere" / "after"
    new.parent.mkdir()
    shutil.move(old, new)
    with pytest.raises(BertflowError, match="the project was moved or copied"):
        tracking.tracking_uri(CFG, new)
    assert list(tracking.relocate_store(CFG, new)) == [old]
    champion = tracking.client(CFG, new).get_model_version_by_alias("task", "champion")
    assert relocation.local_path(champion.source).is_relative_to(new)


def test_a_location_no_file_explains_needs_the_old_folder_named(made, tmp_path):
    old, new = made, tmp_path / "b"
    shutil.copytree(old, new)
    shutil.rmtree(new / "mlartifacts")  # nothing left to match the old locations against
    with pytest.raises(BertflowError, match="relocate --from OLD_FOLDER"):
        tracking.relocate_store(CFG, new)
    assert list(tracking.relocate_store(CFG, new, old)) == [old]
    tracking.check_store(CFG, new)


def test_only_the_projects_own_store_is_checked(made, tmp_path):
    # A tracking server, or a sqlite store at an absolute path, is shared: left alone.
    assert tracking.tracking_uri(section(TrackingConfig, uri="http://127.0.0.1:1"),
                                 tmp_path) == "http://127.0.0.1:1"
    old = made
    shutil.copytree(old, tmp_path / "b")
    shared = section(TrackingConfig, uri=f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", experiment="t")
    assert tracking.tracking_uri(shared, tmp_path / "b") == shared.uri
    with pytest.raises(BertflowError, match="not a project-local sqlite store"):
        tracking.relocate_store(shared, tmp_path / "b")
    # An artifact folder configured outside the project is the user's choice, not a stale one.
    outside = section(TrackingConfig, uri="sqlite:///mlflow.db", artifacts=str(tmp_path / "shared"),
                      experiment="t")
    with tracking.mlflow_run(outside, tmp_path / "e", "r") as run:
        run.log_artifact(old / "data" / "model", "m")
    tracking.check_store(outside, tmp_path / "e")
    assert (tmp_path / "shared").is_dir()


@pytest.mark.parametrize("command", [["run"], ["serve"]])
def test_run_and_serve_refuse_a_copied_store_before_prefect_starts(made, tmp_path, command):
    """Not after Prefect's start and a traceback (run), nor in every scheduled run (serve)."""
    from tests.conftest import run_cli, small_params, write_params

    copy = tmp_path / "copy"
    shutil.copytree(made, copy)
    write_params(copy, small_params(tracking={"uri": CFG.uri, "artifacts": CFG.artifacts,
                                              "experiment": CFG.experiment}))
    out = run_cli("bertflow", *command, cwd=copy, check=False)
    assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr
    assert out.stderr.startswith("error: ") and "bertflow tracking relocate" in out.stderr
    assert not (copy / ".prefect").exists()  # serve started no server


@pytest.mark.parametrize("content", [b"garbage, not a database\n", b"SQLite format 3\x00" + b"\x07" * 200])
def test_a_damaged_store_is_one_clear_error_naming_it(tmp_path, content):
    (tmp_path / "mlflow.db").write_bytes(content)
    with pytest.raises(BertflowError) as e:
        tracking.check_store(CFG, tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'mlflow.db'}: cannot read the MLflow store (")
    assert "restore it from a backup or move it aside" in str(e.value)
    assert (tmp_path / "mlflow.db").read_bytes() == content  # left as it was


def test_a_store_left_with_a_hot_journal_by_a_killed_writer_is_read(tmp_path):
    # A run killed mid-write leaves mlflow.db-journal; a read-only connection cannot roll it back
    # ("attempt to write a readonly database"), so the next command's store check failed.
    import os
    import signal
    import sqlite3
    import subprocess
    import sys

    from components.core.relocation import _connect

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t(x)")
        conn.executemany("insert into t values (?)", [("a" * 1000,)] * 2000)
    writer = subprocess.Popen([sys.executable, "-c", (
        f"import sqlite3, time; c = sqlite3.connect({str(db)!r}); c.execute('pragma cache_size=1');"
        "c.execute('begin'); c.execute(\"update t set x = 'b' || x\"); print('ready', flush=True);"
        "time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "ready"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert (tmp_path / "mlflow.db-journal").exists()
    with _connect(db) as conn:  # rolled back: the killed update never happened
        row = conn.execute("select count(*), min(x) = max(x), min(x) from t").fetchone()
    assert row == (2000, 1, "a" * 1000)
