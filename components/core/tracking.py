"""MLflow runs: one per pipeline run, one nested per stage, with params, stats and lineage tags.

Uses the explicit `MlflowClient` (no process-global active run), so stages can run in any thread
or process and nest under a parent run by id. Imports no other stage module. The project's own
sqlite store is checked, once per process, to keep its artifacts inside the project: a moved or
copied project is refused until `bertflow tracking relocate` (see components/core/relocation.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import posixpath
import signal
import sqlite3
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core import relocation
from components.core.config import TrackingConfig
from components.core.errors import BertflowError
from components.core.io import flatten, umask
from components.core.redact import redact

PARENT_TAG = "mlflow.parentRunId"
KEY_TAG = "bertflow.run_key"  # who owns the run: retries of one Prefect task run share it
ATTEMPTS_TAG = "bertflow.attempts"
ERROR_TAG = "bertflow.error"
OWNER_TAG = "bertflow.owner"  # host:pid:start time of the process that opened the run
KILLED_TAG = "bertflow.killed"
_MAX_PARAM = 6000  # MLflow's limit on a param value
_MAX_KEY = 250  # MLflow's limit on a param, metric or tag name (longer ones are refused, not cut)
DEP_TAG = "dvc.dep."  # lineage: `dvc.dep.<path>` tags a stage's file or folder dep with its hash
_PATH_KEYS = (DEP_TAG,)  # name prefixes followed by a path
_SQLITE = "sqlite:///"
_CHECKED: set[tuple[Path, Path]] = set()  # (store, project) pairs found to match, this process


def store_path(cfg: TrackingConfig, root: Path) -> Path | None:
    """The project's own store: the sqlite file of a relative sqlite URI; None for any other
    (an absolute sqlite path or a tracking server is shared, and not the project's to check)."""
    if cfg.uri.startswith(_SQLITE) and not cfg.uri.startswith(_SQLITE + "/"):
        return (root / cfg.uri[len(_SQLITE):]).resolve()
    return None


def tracking_uri(cfg: TrackingConfig, root: Path) -> str:
    """The tracking URI, with a relative sqlite path taken from the project root; that store is
    checked to keep its artifacts in this project (see check_store)."""
    db = store_path(cfg, root)
    if db is None:
        return cfg.uri
    if not db.exists():
        _create_store(db, artifact_location(cfg, root))
    check_store(cfg, root)
    return _SQLITE + str(db)


def _create_store(db: Path, artifacts: str) -> None:
    """Make the project's sqlite store whole or not at all. MLflow creates its tables in place,
    and a process killed part way left a store every later command failed on ("table
    registered_models already exists"); here they are made in a temp file beside it, which then
    takes the store's name unless another process made one first (a hard link never replaces)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    db.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{db.name}.tmp-", dir=db.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; a store gets the usual mode
    try:
        SqlAlchemyStore(_SQLITE + tmp, artifacts).engine.dispose()  # the tables, registry's too
        with contextlib.suppress(FileExistsError):
            os.link(tmp, db)
    finally:
        os.unlink(tmp)


def _allowed(cfg: TrackingConfig, root: Path) -> list[Path]:
    """Where the store's file artifacts may lie: the project, and a configured folder outside it."""
    external = relocation.local_path(artifact_location(cfg, root))
    return [root.resolve(), *([external] if external else [])]


def check_store(cfg: TrackingConfig, root: Path) -> None:
    """Refuse a project's own store that keeps artifacts outside the project: the project was
    moved or copied, and would read and write the old folder's artifacts. Once per process."""
    db = store_path(cfg, root)
    if db is None or (db, root.resolve()) in _CHECKED or not db.exists():
        return
    try:
        stale = relocation.stale_location(db, cfg.experiment, _allowed(cfg, root))
    except sqlite3.DatabaseError as e:  # damaged, not a database, or locked past the timeout
        raise BertflowError(f"{db}: cannot read the MLflow store ({e}); if it is damaged, restore "
                            "it from a backup or move it aside to start a new one (its runs and "
                            "registry stay in the old file)") from None
    if stale is not None:
        raise BertflowError(f"{db} keeps artifacts at {stale}, outside this project ({root.resolve()}): "
                            "the project was moved or copied (or is mounted elsewhere, as in a "
                            "container); run `bertflow tracking relocate` to point the store at this folder")
    _CHECKED.add((db, root.resolve()))


def relocate_store(cfg: TrackingConfig, root: Path, old: Path | None = None) -> dict[Path, dict[str, int]]:
    """Rewrite the artifact locations of the project's own store from the folder it was copied
    or moved from (`old`, else found from the stale locations) to `root`; {old folder: counts}."""
    db = store_path(cfg, root)
    if db is None:
        raise BertflowError(f"tracking.uri {cfg.uri} is not a project-local sqlite store: "
                            "nothing to relocate (a tracking server keeps its own locations)")
    if not db.exists():
        raise BertflowError(f"{db}: no MLflow store here yet, nothing to relocate")
    root = root.resolve()
    olds = [old.resolve()] if old else relocation.old_roots(db, cfg.experiment, _allowed(cfg, root), root)
    done = {o: relocation.relocate(db, o, root) for o in olds}
    if (stale := relocation.stale_location(db, cfg.experiment, _allowed(cfg, root))) is not None:
        raise BertflowError(f"{db} still keeps artifacts at {stale}, and no file of {root} matches "
                            "it: name the folder the project came from with `bertflow tracking "
                            "relocate --from OLD_FOLDER`")
    return done


def artifact_location(cfg: TrackingConfig, root: Path) -> str:
    """Where new experiments keep artifacts: a URI, or a folder of the project as a file URI."""
    if "://" in cfg.artifacts:
        return cfg.artifacts
    return (root / cfg.artifacts).resolve().as_uri()


def client(cfg: TrackingConfig, root: Path):
    """An MlflowClient on the project's store."""
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(cfg, root)
    # The registry too: else it follows whatever mlflow.set_registry_uri() set in this process.
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_id(cfg: TrackingConfig, root: Path) -> str:
    """Id of the configured experiment, created (with the artifact folder) on first use."""
    c = client(cfg, root)
    exp = c.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        return exp.experiment_id
    try:
        return c.create_experiment(cfg.experiment,
                                   artifact_location=artifact_location(cfg, root))
    except Exception:  # another process created it first
        exp = c.get_experiment_by_name(cfg.experiment)
        if exp is None:
            raise
        return exp.experiment_id


@dataclass
class MlflowRun:
    """An open MLflow run; log through it, it is closed by `mlflow_run()`."""

    client: Any
    run_id: str
    uri: str
    """Tracking URI (for loggers that open their own client, such as Lightning's)."""

    def log_params(self, params: dict[str, Any]) -> None:
        """Log (nested) params flattened to dotted keys."""
        from mlflow.entities import Param

        items = [Param(k, redact(str(v))[:_MAX_PARAM]) for k, v in sorted(_keyed(flatten(params)).items())]
        for start in range(0, len(items), 100):  # MLflow's batch limit for params
            self.client.log_batch(self.run_id, params=items[start:start + 100])

    def log_metrics(self, stats: dict[str, Any], step: int = 0) -> None:
        """Log every finite number in (nested) `stats` as a metric; other values are skipped."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(mlflow_key(k), float(v), now, step)
            for k, v in sorted(flatten(stats).items())
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        ]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Set tags (values as strings)."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, redact(str(v)))
                                                 for k, v in _keyed(tags).items()])

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        """Upload a file or a whole folder."""
        if Path(path).is_dir():
            self.client.log_artifacts(self.run_id, str(path), folder)
        else:
            self.client.log_artifact(self.run_id, str(path), folder)

    def register(self, artifact_path: str, name: str, alias: str, tags: dict[str, str]) -> str:
        """Register the run's artifact folder as a new version of model `name`; point `alias`
        at it; return the version number."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name)
        except MlflowException:  # it exists already
            pass
        source = f"{self.client.get_run(self.run_id).info.artifact_uri}/{artifact_path}"
        version = self.client.create_model_version(name, source, run_id=self.run_id, tags=tags)
        self.client.set_registered_model_alias(name, alias, version.version)
        return version.version


def latest_stages(cfg: TrackingConfig, root: Path) -> list[dict[str, Any]]:
    """The stages of the latest flow run, in the order they started: name, status, start and
    end (ms), minutes (None if skipped), the host that ran it, and for a stage that trains fits
    where they ran (`local` or a Dask scheduler's address) and their hosts."""
    c = client(cfg, root)
    exp = c.get_experiment_by_name(cfg.experiment)
    flows = exp and c.search_runs([exp.experiment_id], "attributes.run_name = 'pipeline'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
    if not flows:
        return []
    runs = c.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{flows[0].info.run_id}'",
                         order_by=["attributes.start_time ASC"], max_results=1000)
    rows = []
    for run in runs:
        tags, seconds = run.data.tags, run.data.metrics.get("this_run.seconds")
        if "bertflow.stage" in tags:
            rows.append({"stage": run.info.run_name, "status": tags.get("bertflow.status", ""),
                         "start": run.info.start_time, "end": run.info.end_time,
                         "minutes": seconds / 60 if seconds is not None else None,
                         "host": tags.get("bertflow.this_run.host", ""),
                         "fits": tags.get("bertflow.this_run.cluster", ""),
                         "fit_hosts": tags.get("bertflow.this_run.hosts", "")})
    return rows


def mlflow_key(key: str) -> str:
    """`key` as a param, metric or tag name that MLflow accepts, one name for one path however
    it is written. MLflow refuses a name holding other characters than alphanumerics and
    `_-. /:`, and one that a path's normal form would change (`data/x/`, `./x`, `x/../x`).

    The path after a prefix of _PATH_KEYS is put in normal form (`dvc.dep.data/x/`,
    `dvc.dep../data/x` and `dvc.dep.data/y/../x` are `dvc.dep.data/x`); `@` becomes `/`
    (`finetune@task`: `finetune/task`); other refused characters (`:` too, which MLflow refuses
    on Windows) become `_`; empty and `.` parts between slashes go. A name that needed more (a
    replaced character, a `..` part) or is too long ends in a digest of what it stood for, so
    that two names never become one."""
    prefix = next((p for p in _PATH_KEYS if key.startswith(p)), "")
    if prefix:
        key = prefix + posixpath.normpath(key[len(prefix):])
    key = key.replace("@", "/")
    cleaned = "".join(ch if ch.isalnum() or ch in "_-. /" else "_" for ch in key)
    parts = cleaned.split("/")
    name = "/".join(part for part in parts if part not in ("", ".", ".."))
    if not name or cleaned != key or ".." in parts or cleaned.startswith("/") or len(name) > _MAX_KEY:
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        name = f"{name[:_MAX_KEY - len(digest) - 1].rstrip('/')}-{digest}"
    return name


def _keyed(items: dict[str, Any]) -> dict[str, Any]:
    """`items` under their MLflow names (mlflow_key)."""
    return {mlflow_key(k): v for k, v in items.items()}


@contextlib.contextmanager
def mlflow_run(cfg: TrackingConfig, root: Path, name: str, *, parent_run_id: str | None = None,
               tags: dict[str, Any] | None = None, key: str | None = None) -> Iterator[MlflowRun]:
    """Open a run (nested under `parent_run_id` if given); FINISHED on success, FAILED on error.

    `key` names the attempt's owner (a Prefect task run): a retry with the same key reopens
    the run its first attempt made instead of adding one; the tag `bertflow.attempts` counts.
    """
    c = client(cfg, root)
    handle = None
    try:
        with _sigterm_held():  # a run is not left RUNNING by a SIGTERM while it is being opened
            handle = _open_run(c, cfg, root, name, parent_run_id, tags or {}, key)
        yield handle
    except BaseException as e:
        if handle is not None:
            _end_failed(c, handle.run_id, f"{type(e).__name__}: {e}")
        raise
    with _sigterm_held():
        c.set_terminated(handle.run_id, "FINISHED")


def _end_failed(c, run_id: str, why: str, attempts: int = 3) -> None:
    """Mark the run FAILED with why, SIGTERM held meanwhile. Another signal's handler may raise
    inside (torch's SIGCHLD check, once a SIGTERM has killed its loader workers): that write is
    tried again. Should all attempts fail, the process that started this one closes the run
    (fail_left_open) or the next run does (close_dead_runs)."""
    for _ in range(attempts):
        with contextlib.suppress(Exception):  # the run's own exception is the one to raise
            with _sigterm_held():
                c.set_tag(run_id, ERROR_TAG, redact(why)[:5000])
                c.set_terminated(run_id, "FAILED")
            return


def fail_left_open(cfg: TrackingConfig, root: Path, key: str, why: str) -> list[str]:
    """Mark FAILED, with why, the runs of attempt `key` still RUNNING: a stage's process that
    has ended without closing its run (SIGKILLed, killed for memory, or its own closing failed)
    is closed by the process that started it. Returns their ids."""
    c = client(cfg, root)
    left = c.search_runs([experiment_id(cfg, root)],
                         f"tags.`{KEY_TAG}` = '{key}' and attributes.status = 'RUNNING'")
    for run in left:
        _end_failed(c, run.info.run_id, why)
    return [run.info.run_id for run in left]


def tag_attempt(cfg: TrackingConfig, root: Path, key: str, tags: dict[str, str]) -> None:
    """Add tags to the run of attempt `key`, finished or not (a stage's lineage, once its flow
    has recorded it in dvc.lock)."""
    from mlflow.entities import RunTag

    c = client(cfg, root)
    for run in c.search_runs([experiment_id(cfg, root)], f"tags.`{KEY_TAG}` = '{key}'", max_results=1):
        c.log_batch(run.info.run_id, tags=[RunTag(k, redact(str(v))) for k, v in _keyed(tags).items()])


def _open_run(c, cfg: TrackingConfig, root: Path, name: str, parent_run_id: str | None,
              tags: dict[str, Any], key: str | None) -> MlflowRun:
    """Create the run, or reopen the one an earlier attempt with the same key made."""
    all_tags = {k: redact(str(v)) for k, v in _keyed(tags).items()}
    all_tags[OWNER_TAG] = _owner()
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    exp = experiment_id(cfg, root)
    earlier = c.search_runs([exp], f"tags.`{KEY_TAG}` = '{key}'", max_results=1) if key else []
    if not earlier:
        first = {**all_tags, **({KEY_TAG: key} if key else {}), ATTEMPTS_TAG: "1"}
        return MlflowRun(c, c.create_run(exp, run_name=name, tags=first).info.run_id,
                         tracking_uri(cfg, root))
    run_id, previous = earlier[0].info.run_id, earlier[0].data.tags
    c.update_run(run_id, status="RUNNING")
    if ERROR_TAG in previous:  # kept, under another name, as why it was retried
        all_tags["bertflow.retried_after"] = previous[ERROR_TAG]
        c.delete_tag(run_id, ERROR_TAG)
    handle = MlflowRun(c, run_id, tracking_uri(cfg, root))
    handle.set_tags({**all_tags, ATTEMPTS_TAG: int(previous.get(ATTEMPTS_TAG, "1")) + 1})
    return handle


def _owner(pid: int | None = None) -> str:
    """This host, a process id and its start time: a pid reused by a later process differs."""
    import socket

    import psutil

    proc = psutil.Process(pid)
    return f"{socket.gethostname()}:{proc.pid}:{proc.create_time():.2f}"


def close_dead_runs(cfg: TrackingConfig, root: Path) -> list[str]:
    """Mark KILLED the RUNNING runs whose process on this host is gone (a SIGKILL, a power cut
    leaves them RUNNING for ever); returns their ids. Runs of other hosts are left alone."""
    import socket

    import psutil

    c, host = client(cfg, root), socket.gethostname()
    dead = []
    for run in c.search_runs([experiment_id(cfg, root)], "attributes.status = 'RUNNING'", max_results=1000):
        owner_host, _, rest = run.data.tags.get(OWNER_TAG, "").partition(":")
        pid, _, started = rest.partition(":")
        if owner_host != host or not pid.isdigit():
            continue
        try:
            alive = _owner(int(pid)).endswith(f":{pid}:{started}")
        except psutil.Error:
            alive = False
        if not alive:
            c.set_tag(run.info.run_id, KILLED_TAG, f"its process (pid {pid}) had ended without closing it")
            c.set_terminated(run.info.run_id, "KILLED")
            dead.append(run.info.run_id)
    return dead


@contextlib.contextmanager
def _sigterm_held() -> Iterator[None]:
    """A SIGTERM that arrives inside is acted on when the block ends, by the handler that was
    there before: a run whose row exists also has its handle, so the caller can mark it FAILED.
    Signals reach only the main thread; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is None:
        yield  # (None: a handler set outside Python, which could not be put back)
        return
    held: list[tuple[int, Any]] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if held:
            if callable(previous):
                previous(*held[0])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGTERM)


def git_state(root: Path) -> dict[str, str]:
    """Lineage tags for the code: commit, and whether tracked files differ from it; with no
    commit, `git.error` says why (not a repository, git refusing another user's checkout...)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0 or not head.stdout.strip():
        reason = (head.stderr.strip().splitlines() or ["no commit"])[0]
        return {"git.commit": "none", "git.error": reason[:500]}
    commit = head.stdout.strip()
    dirty = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    return {"git.commit": commit, "git.dirty": str(dirty).lower()}
