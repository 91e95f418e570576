"""Atomic writes, shard naming and listing: nothing half-written is ever visible as complete."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.core.guard import WORK, claim, mark, mark_work, remove_owned

SHARD_GLOB = "part-*.parquet"
SPLITS = ("train", "heldout")  # the sub-folders of the clean and pairs outputs


def shard_name(index: int) -> str:
    """File name of shard `index` (zero-padded so names sort in order)."""
    return f"part-{index:05d}.parquet"


def list_shards(folder: Path) -> list[Path]:
    """The shards of a stage output folder, in order; [] if there are none."""
    return sorted(Path(folder).glob(SHARD_GLOB))


def iter_rows(folder: Path, columns: tuple[str, ...]) -> Iterator[dict]:
    """Stream the rows of a folder of shards, one shard in memory at a time."""
    import pyarrow.parquet as pq

    for path in list_shards(folder):
        yield from pq.read_table(path, columns=list(columns)).to_pylist()


def special_file(path: Path) -> str:
    """What `path` is when it is neither a regular file nor a folder ("a FIFO", "a socket", "a
    device"), else "". Reading a FIFO would wait forever for a writer; a device may never end."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return ""
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def printable(path: Path | str) -> str:
    """`path` as text that can be printed and stored: a file name that is not UTF-8 (its bytes
    kept by Python as surrogates) shows its odd bytes as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield an empty temp folder beside `final`; on success it replaces `final`, on error it goes.

    Readers never see a partly written output: the folder appears under its real name only
    after everything in it was written (and validated, when the caller validates inside). It
    replaces only a folder bertflow made (components.core.guard), checked before any work, and
    marks the new one as such.
    """
    final = Path(final)
    claim(final)
    made = [p for p in final.parents if not p.exists()]  # innermost first: removed on error
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.*-*"):  # left by a killed earlier run ...
        remove_owned(stale)  # ... and only those: never a user's `.raw.backup-1`, nor a copy
    tmp = _temp_dir(final, "tmp")
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:  # a failed first run leaves no empty data/ behind either
            with contextlib.suppress(OSError):
                folder.rmdir()
        if _disk_full(e):  # the folder that filled is what the user must free or move
            raise OSError(errno.ENOSPC, "No space left on device while writing into",
                          str(final.parent)) from e
        raise
    _usual_modes(tmp)
    mark(tmp)  # the manifest first: a kill in between leaves a folder that is still marked
    (tmp / WORK).unlink()
    replace_path(tmp, final)


def _disk_full(e: BaseException) -> bool:
    """Whether `e` is a full disk that names no file: an OSError without a filename, or a
    library's own error around one (safetensors' writer raises SafetensorError, its text holding
    the OS message)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT) and not e.filename
    return os.strerror(errno.ENOSPC) in str(e) or os.strerror(errno.EDQUOT) in str(e)


def _usual_modes(folder: Path) -> None:
    """Every file and folder under `folder` with the mode a new one gets here (0644 and 0755
    under the usual umask): libraries that write through a temp file (safetensors) leave 0600."""
    mask = umask()
    for path in folder.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _temp_dir(final: Path, kind: str) -> Path:
    """A new folder `.{final.name}.{kind}-XXXXXXXX` beside `final`, marked as a work folder."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.{kind}-", dir=final.parent))
    os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes 0700; outputs get the usual mode
    mark_work(tmp)
    return tmp


def replace_path(src: Path, dst: Path) -> None:
    """Move `src` to `dst`, replacing what is there (a file or a whole folder). A folder is first
    moved into a marked temp folder, so that a kill in between leaves nothing unmarked behind.
    Only a folder bertflow made is replaced."""
    claim(dst)
    if dst.is_dir():
        old = _temp_dir(dst, "old")
        os.replace(dst, old / dst.name)
        os.replace(src, dst)
        remove_owned(old)
    else:
        os.replace(src, dst)


def concat_shards(parts: list[Path], dst: Path) -> int:
    """Stream Parquet files with one schema into `dst`, one file in memory at a time; rows out."""
    import pyarrow.parquet as pq

    rows = 0
    writer = None
    try:
        for part in parts:
            table = pq.read_table(part)
            if writer is None:
                writer = pq.ParquetWriter(dst, table.schema)
            writer.write_table(table)
            rows += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; it replaces `path` on success and goes on error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~umask())
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same folder, then rename)."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                       encoding="utf-8")


def umask() -> int:
    """The process's umask (read by setting it, then back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_json(path: Path) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
