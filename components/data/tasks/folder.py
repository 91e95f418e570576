"""A prepared task folder, as the task_data stage writes it and fine-tuning and evaluation read
it: `{train,valid,test}.parquet` of the kind's schema and meta.json ({"task", "kind", "labels"};
token and span tasks also "scheme", bio or plain)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import DataError
from components.core.io import read_json

SPLIT_NAMES = ("train", "valid", "test")
SCHEMAS = {
    "classification": pa.schema([("text", pa.string()), ("label", pa.string())]),
    "pair": pa.schema([("text_a", pa.string()), ("text_b", pa.string()), ("label", pa.string())]),
    "token": pa.schema([("tokens", pa.list_(pa.string())), ("tags", pa.list_(pa.string()))]),
}
SCHEMAS["span"] = SCHEMAS["token"]


def read_split(task_dir: Path, split: str) -> pa.Table:
    """One split of a prepared task (`train`, `valid` or `test`) as an Arrow table."""
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
    path = Path(task_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"{path} does not exist; run the task_data stage for this task first")
    return pq.read_table(path)


def read_meta(task_dir: Path) -> dict:
    """The task's meta.json: {"task": name, "kind": kind, "labels": [...]} and, for token and
    span tasks, "scheme" (bio for data written before plain tags existed)."""
    path = Path(task_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{path} does not exist; run the task_data stage for this task first")
    meta = read_json(path)
    if meta.get("kind") in ("token", "span"):
        meta.setdefault("scheme", "bio")
    return meta
