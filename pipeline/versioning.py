"""DVC as the single source of truth for data versions: staleness, lock records, dep hashes.

The Prefect flow asks DVC whether a stage is stale, runs the stage function, then records the
result with `dvc commit`: dvc.lock and the cache end up exactly as `dvc repro` leaves them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from components.core.errors import BertflowError


def is_dvc_project(root: Path) -> bool:
    """True if `root` has a dvc.yaml and an initialised .dvc folder."""
    return (root / "dvc.yaml").is_file() and (root / ".dvc").is_dir()


@functools.cache
def _lock_read_by_libyaml() -> None:
    """To record a stage, DVC parses dvc.lock with ruamel's round-trip parser, which keeps
    comments (DVC writes none there) and is pure Python; with every stage's code deps the file
    holds thousands of entries, and that parse took about a third of each stage's record.
    dvc.lock is read by the safe parser (libyaml) instead: DVC writes the same bytes from its
    data (tests/test_pipeline.py). Other files DVC edits keep the round trip."""
    try:
        from dvc.utils.serialize import _yaml

        round_trip, safe = _yaml.parse_yaml_for_update, _yaml.parse_yaml
    except (ImportError, AttributeError):  # another DVC's insides: its own way, only slower
        return

    def parse_for_update(text: str, path) -> object:
        return safe(text, path) if os.path.basename(path) == "dvc.lock" else round_trip(text, path)

    _yaml.parse_yaml_for_update = parse_for_update


# One DVC call at a time in this process: the flow's stages record themselves from threads, and
# DVC's repo (and the working directory it needs) is not theirs to share.
_ONE_AT_A_TIME = threading.RLock()


@contextlib.contextmanager
def _repo(root: Path) -> Iterator:
    from dvc.repo import Repo
    from dvc.utils.serialize import ParseError

    _lock_read_by_libyaml()
    # DVC resolves some paths against the working directory: work from the project root.
    with _ONE_AT_A_TIME, contextlib.chdir(root):
        repo = Repo(str(root))
        try:
            yield repo
        except ParseError as e:  # a dvc.yaml or dvc.lock cut short or edited by hand
            hint = "; `git checkout dvc.lock` puts back the committed one" if "dvc.lock" in str(e) else ""
            raise BertflowError(f"DVC: {e}{hint}") from None
        finally:
            repo.close()


def lock_file(root: Path, stage: str) -> Path:
    """The dvc.lock that records `stage` (an address: `train`, or `presets/x/dvc.yaml:train`)."""
    pipeline, _, name = stage.rpartition(":")
    return root / Path(pipeline).parent / "dvc.lock" if pipeline else root / "dvc.lock"


def is_stale(root: Path, stage: str) -> bool:
    """Whether DVC would rerun `stage` now (changed deps, params, cmd, or missing outs)."""
    with _repo(root) as repo:
        return bool(repo.status(targets=[stage]))


def stale_stages(root: Path, pipelines: list[str]) -> set[str]:
    """Every stage of the pipelines (dvc.yaml files) DVC would rerun now, by address, in one pass
    (a run's first check: asking stage by stage loads dvc.yaml and dvc.lock again for each)."""
    with _repo(root) as repo:
        return set(repo.status(targets=pipelines))


JOURNAL = ".before-commit"  # a dvc.lock kept aside while a commit rewrites it


def _journal(root: Path, lock: Path) -> Path:
    """`lock` as it was before the `dvc commit` under way (DVC's temp folder, git-ignored):
    `dvc.lock.before-commit`, `presets__x__dvc.lock.before-commit`."""
    return root / ".dvc" / "tmp" / (lock.relative_to(root).as_posix().replace("/", "__") + JOURNAL)


def commit(root: Path, stage: str) -> None:
    """Record the stage's current deps and outs in its dvc.lock and the cache (as `dvc repro`
    does); one stage at a time, whichever thread records it.

    DVC rewrites dvc.lock in place, so a kill mid-write would leave it truncated and every later
    DVC call failing: the old dvc.lock is kept aside until the commit ends (see recover_locks).
    """
    from components.core.io import atomic_file

    lock = lock_file(root, stage)
    journal = _journal(root, lock)
    with _ONE_AT_A_TIME:
        with atomic_file(journal) as tmp:  # empty: there was no dvc.lock
            tmp.write_bytes(lock.read_bytes() if lock.exists() else b"")
        with _repo(root) as repo:
            committed = repo.commit(stage, force=True)
            # DVC logs a failed cache copy (a full disk: ENOSPC) and records the stage all the
            # same; its status then says "not in cache". Recorded so, the stage's outputs exist
            # nowhere but in the workspace: put dvc.lock back and fail instead. (The status of the
            # stage objects just recorded: `repo.status` would load dvc.yaml and dvc.lock again.)
            with repo.lock:  # as `repo.status` takes it
                missing = {k: v for s in committed for k, v in s.status().items()}
        if missing:
            _restore(journal, lock)
            raise BertflowError(f"stage {stage}: DVC could not store its outputs in its cache "
                                f"({_status_line(missing)}); dvc.lock is left as it was, so the stage "
                                "runs again: free space in the DVC cache (`dvc cache dir` says "
                                "where) and rerun")
        journal.unlink()


def _status_line(status: dict) -> str:
    """`{'ingest': [{'changed outs': {'data/raw': 'not in cache'}}]}` -> `data/raw: not in cache`."""
    parts = [f"{path}: {what}" for changes in status.values() for change in changes
             if isinstance(change, dict) for group in change.values() if isinstance(group, dict)
             for path, what in group.items()]
    return "; ".join(parts) or str(status)


def recover_locks(root: Path) -> list[Path]:
    """Put each dvc.lock back as it was before a commit that a kill cut short; the ones it put
    back. The stage that commit recorded is then stale again, and the next run redoes it."""
    restored = []
    for journal in sorted((root / ".dvc" / "tmp").glob(f"*{JOURNAL}")):
        lock = root / journal.name.removesuffix(JOURNAL).replace("__", "/")
        _restore(journal, lock)
        restored.append(lock.relative_to(root))
    return restored


def _restore(journal: Path, lock: Path) -> None:
    """`lock` as its journal kept it (none: there was no dvc.lock)."""
    if journal.stat().st_size:
        os.replace(journal, lock)
    else:
        lock.unlink(missing_ok=True)
        journal.unlink()


def recover_rwlock(root: Path) -> bool:
    """Remove DVC's stage-lock table if a kill cut its rewrite short; True if it did.

    DVC rewrites .dvc/tmp/rwlock in place on every status and commit, so a kill mid-write leaves
    it unreadable and every later DVC call failing. It only names processes that hold a stage;
    under the project lock the only writer was the killed run, so an unreadable table holds no
    live entry. Checked under DVC's own guard, as DVC edits it.
    """
    import json

    from dvc.lock import make_lock

    tmp = root / ".dvc" / "tmp"
    table = tmp / "rwlock"
    if not table.exists():
        return False
    with make_lock(str(tmp / "rwlock.lock"), tmp_dir=str(tmp)):
        try:
            json.loads(table.read_text(encoding="utf-8"))
            return False
        except (ValueError, UnicodeDecodeError):
            table.unlink()
            return True


def dep_hashes(root: Path, stage: str) -> dict[str, str]:
    """The hashes dvc.lock records for the stage's file and folder deps, as lineage tags."""
    from dvc.exceptions import NoOutputOrStageError, StageNotFoundError
    from dvc.stage.exceptions import StageNotFound

    from components.core.tracking import DEP_TAG

    tags = {}
    with _repo(root) as repo:
        try:
            (resolved,) = repo.stage.collect(stage)
        except (StageNotFound, StageNotFoundError, NoOutputOrStageError):
            raise BertflowError(f"dvc.yaml has no stage {stage}: it was written before params.yaml "
                                "named it; `bertflow run` brings dvc.yaml up to date first, or run "
                                "`python -m pipeline.deps --write`") from None
        for dep in resolved.deps:
            if hasattr(dep, "params"):  # params are logged as MLflow params already
                continue
            try:
                value = dep.get_hash().value
            except Exception:  # a dep that does not exist yet
                value = "missing"
            tags[f"{DEP_TAG}{dep.def_path}"] = value
    return tags


def recorded_dep_hashes(root: Path, stage: str) -> dict[str, str]:
    """dep_hashes of a stage DVC found up to date, read from its dvc.lock: its deps hash as
    recorded there, without hashing them again."""
    from components.core.tracking import DEP_TAG

    return {f"{DEP_TAG}{d['path']}": d["md5"] for d in _entry(root, stage).get("deps", [])}


def changed_outs(root: Path, *stages: str) -> dict[str, str]:
    """{path: how} of the stages' outputs that differ from what dvc.lock records ("modified",
    "deleted", "not in cache"); empty when the workspace holds exactly dvc.lock's outputs."""
    with _repo(root) as repo:
        status = repo.status(targets=list(stages))
    return {path: how for entries in status.values() for entry in entries if isinstance(entry, dict)
            for path, how in entry.get("changed outs", {}).items()}


def lock_hashes(root: Path, *stages: str) -> dict[str, str]:
    """{path: md5} of the data deps and outs their dvc.lock records for `stages` (code deps left
    out); empty for a stage not recorded."""
    entries = [d for stage in stages for key in ("deps", "outs") for d in _entry(root, stage).get(key, [])]
    return {d["path"]: d["md5"] for d in entries if "md5" in d and not d["path"].endswith(".py")}


def has_remote(root: Path) -> bool:
    """Whether a default DVC remote is configured."""
    with _repo(root) as repo:
        return bool(repo.config["core"].get("remote"))


def pull(root: Path) -> None:
    """`dvc pull`: fetch and check out every output dvc.lock records, from the default remote."""
    with _repo(root) as repo:
        repo.pull()


def push(root: Path) -> int:
    """`dvc push`: upload every cached output of dvc.lock to the default remote; files sent."""
    with _repo(root) as repo:
        return repo.push()


def recorded(root: Path, stage: str) -> bool:
    """Whether its dvc.lock records the stage."""
    return bool(_entry(root, stage))


def _entry(root: Path, stage: str) -> dict:
    """The stage's entry in its dvc.lock ({} if none): shared between calls, not to be changed.
    The flow asks once per skipped stage; a file is parsed once per version of it."""
    lock = lock_file(root, stage)
    try:
        stat = lock.stat()
    except FileNotFoundError:
        return {}
    return _parsed_lock(lock, (stat.st_mtime_ns, stat.st_size, stat.st_ino)).get(stage.rpartition(":")[2], {})


@functools.lru_cache(maxsize=4)
def _parsed_lock(path: Path, version: tuple[int, int, int]) -> dict[str, dict]:
    """The stages of the dvc.lock at `path` as it is at `version`, parsed by libyaml where
    PyYAML has it."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return (yaml.load(path.read_text(), Loader=loader) or {}).get("stages", {})
