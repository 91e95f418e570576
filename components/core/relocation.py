"""The artifact locations a project-local MLflow store pins, checked and rewritten.

MLflow's sqlite store keeps absolute locations (`file:///old/project/mlartifacts/...`): a copied
or moved project would read and write the old folder's artifacts. `stale_location` finds a
location outside the project (the check every open of the store runs); `relocate` rewrites an
old project folder to the new one in every table and column of MLflow 3's schema that holds
artifact locations. Plain sqlite3, so neither needs (nor migrates) MLflow.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from components.core.errors import BertflowError

# (table, column, which rows): every place MLflow 3's sqlite store keeps an artifact location.
LOCATIONS: tuple[tuple[str, str, str], ...] = (
    ("experiments", "artifact_location", "1"),
    ("runs", "artifact_uri", "1"),
    ("model_versions", "source", "1"),
    ("model_versions", "storage_location", "1"),
    ("logged_models", "artifact_location", "1"),
    ("trace_tags", "value", "key = 'mlflow.artifactLocation'"),  # where a trace's data lies
)
# Checked: experiments with runs or models, or the one new runs go to. MLflow makes experiment
# 0 ("Default") with the working directory's ./mlruns, wherever the first command ran: unused,
# it is no location of the project's.
_USED_EXPERIMENT = ("experiment_id IN (SELECT experiment_id FROM runs) OR experiment_id IN "
                    "(SELECT experiment_id FROM logged_models) OR name = :experiment")


def local_path(location: str | None) -> Path | None:
    """The folder a `file:` URI or an absolute path names; None for any other URI (s3://...)."""
    if not location:
        return None
    parsed = urlparse(location)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    if not parsed.scheme and location.startswith("/"):
        return Path(location)
    return None


def _connect(db: Path, write: bool = False) -> sqlite3.Connection:
    # Read-only unless writing: the check must never create or change a store. A writer killed
    # mid-transaction leaves a hot journal, which a read-only connection cannot roll back
    # ("attempt to write a readonly database"): an existing store is opened read-write once for
    # sqlite to roll it back, as any later writer (MLflow) would.
    if not write and Path(f"{db}-journal").exists():
        with contextlib.closing(_connect(db, write=True)) as conn:
            conn.execute("select count(*) from sqlite_master").fetchone()
    mode = "rw" if write else "ro"
    return sqlite3.connect(f"{db.resolve().as_uri()}?mode={mode}", uri=True, timeout=60)


def _rows(conn: sqlite3.Connection, table: str, column: str, where: str,
          params: dict[str, str]) -> Iterator[str]:
    """The column's values; nothing when this schema lacks the table (an older MLflow)."""
    try:
        yield from (v for (v,) in conn.execute(f"SELECT {column} FROM {table} WHERE {where}", params)
                    if v)
    except sqlite3.OperationalError as e:
        if "no such table" not in str(e) and "no such column" not in str(e):
            raise


def locations(db: Path, experiment: str) -> Iterator[tuple[str, str]]:
    """(table.column, location) of every artifact location the store keeps that is in use."""
    with contextlib.closing(_connect(db)) as conn:
        for table, column, where in LOCATIONS:
            if table == "experiments":
                where = _USED_EXPERIMENT
            for value in _rows(conn, table, column, where, {"experiment": experiment}):
                yield f"{table}.{column}", value


def stale_locations(db: Path, experiment: str, allowed: Iterable[Path]) -> Iterator[str]:
    """The local artifact locations of the store outside every `allowed` folder."""
    folders = list(allowed)
    for _, value in locations(db, experiment):
        path = local_path(value)
        if path is not None and not any(path.is_relative_to(f) for f in folders):
            yield value


def stale_location(db: Path, experiment: str, allowed: Iterable[Path]) -> str | None:
    """The first stale location (see stale_locations), or None."""
    return next(stale_locations(db, experiment, allowed), None)


def old_root(location: str, root: Path) -> Path | None:
    """The folder a stale location's project was in: the prefix whose rest, put under `root`,
    exists (the copy holds the same files); None if no prefix does."""
    path = local_path(location)
    if path is None:
        return None
    parts = path.parts
    for k in range(1, len(parts)):
        if (root.joinpath(*parts[k:])).exists():
            return Path(*parts[:k])
    return None


def old_roots(db: Path, experiment: str, allowed: Iterable[Path], root: Path) -> list[Path]:
    """The folders the store's stale locations were made in (see old_root), once each."""
    found = {old_root(value, root) for value in stale_locations(db, experiment, allowed)}
    return sorted(old for old in found if old is not None)


def _prefixes(old: Path, new: Path) -> list[tuple[str, str]]:
    # A location is kept as a file URI (percent-encoded, as Path.as_uri writes it) or as a
    # plain path (experiment 0's): both spellings are rewritten.
    return [(old.as_uri(), new.as_uri()), (str(old), str(new))]


def relocate(db: Path, old: Path, new: Path) -> dict[str, int]:
    """Rewrite every artifact location under `old` to the same place under `new`, in one
    transaction; the number of values rewritten per table.column."""
    if old == new:
        raise BertflowError(f"{db}: the old and the new folder are both {new}")
    counts: dict[str, int] = {}
    # closing() closes; the connection's own context manager commits, or rolls back on error.
    with contextlib.closing(_connect(db, write=True)) as conn, conn:
        for table, column, where in LOCATIONS:
            for before, after in _prefixes(old, new):
                sql = (f"UPDATE {table} SET {column} = :after || substr({column}, length(:before) + 1) "
                       f"WHERE ({where}) AND ({column} = :before OR "
                       f"substr({column}, 1, length(:before) + 1) = :before || '/')")
                try:
                    changed = conn.execute(sql, {"before": before, "after": after}).rowcount
                except sqlite3.OperationalError as e:
                    if "no such table" in str(e) or "no such column" in str(e):
                        break
                    raise
                if changed:
                    key = f"{table}.{column}"
                    counts[key] = counts.get(key, 0) + changed
    return counts
