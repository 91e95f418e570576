"""Your own task files: CSV/TSV, JSON Lines or Parquet for text tasks, CoNLL columns (or JSON
Lines / Parquet lists) for token and span tasks; one file split by the seed, or a folder of
train/valid(dev)/test files. Every example keeps where it came from (file and line), for errors."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import ConfigError, DataError
from components.core.io import special_file
from components.data.tasks.folder import SPLIT_NAMES
from components.data.tasks.source import (
    ROLES,
    Context,
    Example,
    read_text,
    seeded_split,
    short,
    split_all,
)

# A CSV field may be as long as the text it holds (a whole article): the file is in memory
# already, and the csv module's default limit of 131,072 characters refused such a file.
csv.field_size_limit(2**31 - 1)
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".json": "jsonl",
                  ".parquet": "parquet"}
SPLIT_ALIASES = {"train": "train", "valid": "valid", "dev": "valid", "validation": "valid",
                 "test": "test"}


def load_user(path: Path, ctx: Context) -> dict[str, list[Example]]:
    """A single file (split by the seed) or a folder of train/valid(dev)/test files."""
    # Recorded relative to the project: the stats are committed, and clones live anywhere.
    def shown(p: Path) -> str:
        return str(p.relative_to(ctx.root)) if p.is_relative_to(ctx.root) else str(p)

    if kind := special_file(path):
        raise DataError(f"task '{ctx.name}': {path} is {kind}, not a file or folder")
    if path.is_file():
        ctx.source = f"file {shown(path)}"
        return split_all(_read_user_file(path, ctx), ctx)
    files: dict[str, Path] = {}
    for p in sorted(path.iterdir()):
        if (kind := special_file(p)) and p.stem.lower() in SPLIT_ALIASES:
            raise DataError(f"{p}: {kind}, not a regular file; give a file")
        split = SPLIT_ALIASES.get(p.stem.lower()) if p.is_file() else None
        if split is None or not _usable(p, ctx.task.kind):
            continue
        if split in files:
            raise DataError(f"{path}: two files for the {split} split: {files[split].name} "
                            f"and {p.name}")
        files[split] = p
    if "train" not in files:
        present = sorted(p.name for p in path.iterdir())
        raise DataError(f"{path}: no train file (train.csv, train.jsonl, train.parquet; CoNLL: "
                        f"train.txt ...); the folder holds {present}")
    ctx.source = "folder " + ", ".join(shown(files[s]) for s in SPLIT_NAMES if s in files)
    ctx.files = dict(files)
    splits = {s: _read_user_file(p, ctx) for s, p in files.items()}
    missing = [s for s in SPLIT_NAMES if s not in files]
    if missing:  # carve the missing splits out of train, in the configured proportions
        fractions = dict(zip(SPLIT_NAMES, ctx.task.split, strict=True))
        carved = seeded_split(splits["train"], {s: fractions[s] for s in ["train", *missing]},
                               ctx.task.split_seed)
        splits.update(carved)
        ctx.split = (f"given; {', '.join(missing)} carved from train (fractions "
                     f"{list(ctx.task.split)}, seed {ctx.task.split_seed})")
    else:
        ctx.split = "given"
    return splits


def _usable(path: Path, kind: str) -> bool:
    """Whether a folder's file can hold this kind of task (CoNLL files may have any suffix)."""
    if kind in ("classification", "pair"):
        return path.suffix.lower() in TABLE_SUFFIXES
    return not path.name.startswith(".")


def _read_user_file(path: Path, ctx: Context) -> list[Example]:
    """The examples of one user file, by kind and suffix."""
    fmt = TABLE_SUFFIXES.get(path.suffix.lower())
    if ctx.task.kind in ("token", "span"):
        if fmt in ("jsonl", "parquet"):  # lists of tokens and tags in two fields
            return _read_table_file(path, fmt, ctx)
        return read_conll(path, ctx.task.columns, ctx)
    if fmt is None:
        raise DataError(f"{path}: a {ctx.task.kind} task reads .csv, .tsv, .jsonl/.json or "
                        f".parquet files, not '{path.suffix or path.name}'")
    return _read_table_file(path, fmt, ctx)


def _role_columns(ctx: Context) -> dict[str, str]:
    """Role -> the file's column name (a role's own name unless task.columns maps it)."""
    return {role: ctx.task.columns.get(role, role) for role in ROLES[ctx.task.kind]}


def _read_table_file(path: Path, fmt: str, ctx: Context) -> list[Example]:
    """Examples from CSV, JSON Lines or Parquet, each named by its file and line/row."""
    columns = _role_columns(ctx)
    rows = {"csv": _csv_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows}[fmt]
    out = []
    for where, record in rows(path, columns, ctx.changed):
        ex: Example = {"_where": where}
        for role, column in columns.items():
            ex[role] = _value(record[column], role, column, where)
        out.append(ex)
    return out


def _missing(path: Path, columns: dict[str, str], present: list[str], where: str) -> None:
    """Raise naming the first role whose column is not in the file."""
    for role, column in columns.items():
        if column not in present:
            hint = "" if role == column else f" (task.columns maps role '{role}' to it)"
            raise DataError(f"{where}: no column '{column}'{hint}; columns present: {present}")


def _csv_rows(path: Path, columns: dict[str, str], changed: Counter) -> Any:
    """(where, row) of a CSV/TSV file with a header line."""
    text = read_text(path, changed)
    # strict: a quote left open or text after a closing quote is an error; the lenient reader
    # swallowed the rest of the file into one field, or dropped the quotes without a word.
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True,
                            delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
    try:
        present = list(reader.fieldnames or [])
        if not present:
            raise DataError(f"{path}: empty, not even a header line (a CSV task file starts with "
                            f"its column names: {', '.join(columns.values())})")
        twice = sorted({c for c in present if present.count(c) > 1})
        if twice:  # DictReader would keep the last column of each name without a word
            raise DataError(f"{path}:1 (header): column {', '.join(map(repr, twice))} appears more "
                            "than once; name each column once")
        _missing(path, columns, present, f"{path}:1 (header)")
        for row_no, row in enumerate(reader, 1):
            where = f"{path}:{reader.line_num} (row {row_no})"
            if None in row:  # more fields than the header: a quoting problem, not data
                raise DataError(f"{where}: {len(present) + len(row[None])} fields but the header "
                                f"has {len(present)}; quote fields that contain commas")
            if any(row[c] is None for c in columns.values()):  # fewer: a field the task reads is gone
                raise DataError(f"{where}: {sum(v is not None for v in row.values())} of the header's "
                                f"{len(present)} fields; every row needs every column")
            yield where, row
    except csv.Error as e:  # in the row after the last one read
        raise DataError(f"{path}:{reader.line_num + 1}: not readable as CSV ({e}); a quoted field "
                        'ends with a quote, and a quote inside one is written twice ("")') from None


def _lines(text: str) -> list[str]:
    """Lines end at \\n (and \\r\\n) only: str.splitlines also splits at U+2028, U+0085 and
    other characters that valid JSON strings and tokens may hold."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _jsonl_rows(path: Path, columns: dict[str, str], changed: Counter) -> Any:
    """(where, record) of a JSON Lines file: one object per line."""
    for lineno, line in enumerate(_lines(read_text(path, changed)), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not a valid JSON line ({e.msg}); .jsonl/.json files "
                            f"hold one JSON object per line") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        _missing(path, columns, list(record), where)
        yield where, record


def _parquet_rows(path: Path, columns: dict[str, str], changed: Counter) -> Any:
    """(where, row) of a Parquet file; rows are numbered from 0."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    _missing(path, columns, table.column_names, str(path))
    data = {c: table[c].to_pylist() for c in set(columns.values())}
    for i in range(table.num_rows):
        yield f"{path}: row {i}", {c: data[c][i] for c in data}


def _value(value: Any, role: str, column: str, where: str) -> Any:
    """A cell as the role's type: text as str, labels as str, tokens and tags as str lists."""
    if role in ("tokens", "tags"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DataError(f"{where}: '{column}' must be a list of strings, got {short(value)}")
        return value
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if role == "label" and isinstance(value, int | float):
        return str(value)  # numeric labels (0/1) become their text; the label map is strings
    if not isinstance(value, str):
        raise DataError(f"{where}: '{column}' must be text, got {type(value).__name__} "
                        f"{short(value)}")
    return value


# A CoNLL "sentence" longer than this is taken for blank lines gone missing (a file saved
# without them): CoNLL-2003's longest has 124 tokens, and one of thousands would be cut to
# max_seq_len in training, the rest of the file lost without a word.
MAX_CONLL_TOKENS = 1000


def read_conll(path: Path, columns: dict[str, str], ctx: Context) -> list[Example]:
    """CoNLL columns: one token per line, blank lines between sentences, -DOCSTART- skipped."""
    tok_col = _column_index(columns.get("tokens", "0"), "tokens", ctx)
    tag_col = _column_index(columns.get("tags", "-1"), "tags", ctx)
    out: list[Example] = []
    tokens: list[str] = []
    tags: list[str] = []
    start = width = 0

    def flush() -> None:
        if len(tokens) > MAX_CONLL_TOKENS:
            raise DataError(f"{path}:{start}: {len(tokens)} tokens from line {start} on without a "
                            f"blank line; CoNLL files end each sentence with one (a sentence over "
                            f"{MAX_CONLL_TOKENS} tokens is taken for missing blank lines; give longer "
                            "examples as JSON Lines of tokens and tags)")
        if tokens:
            out.append({"tokens": tokens.copy(), "tags": tags.copy(), "_where": f"{path}:{start}",
                        "_file": str(path), "_line": start})
            tokens.clear()
            tags.clear()

    for lineno, line in enumerate(_lines(read_text(path, ctx.changed)), 1):
        parts = line.split("\t") if "\t" in line else line.split()
        parts = [p.strip() for p in parts]
        if not any(parts):
            flush()
            continue
        if parts[0] == "-DOCSTART-":
            flush()
            continue
        width = width or len(parts)
        need = max(tok_col if tok_col >= 0 else -tok_col - 1, tag_col if tag_col >= 0 else -tag_col - 1)
        if len(parts) != width or len(parts) <= need:
            raise DataError(f"{path}:{lineno}: {len(parts)} column(s) {parts!r}, but earlier lines "
                            f"have {width}: every token needs its tag (tokens and tags of "
                            f"different lengths)")
        if not tokens:
            start = lineno
        tokens.append(parts[tok_col])
        tags.append(parts[tag_col])
    flush()
    return out


def _column_index(value: str, role: str, ctx: Context) -> int:
    """A CoNLL column number from task.columns (0-based; negative counts from the end)."""
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"finetune.tasks.{ctx.name}.columns.{role}: a CoNLL column number "
                          f"(0-based, -1 for the last), got {value!r}") from None
