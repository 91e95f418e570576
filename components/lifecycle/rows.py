"""Rows of model input: the columns each task kind reads, CSV and JSON Lines files read a
batch at a time with where each row is (for error messages), and what one call may hold.

Nothing here needs torch: `bertflow predict` checks its input, and the registry its signatures,
without loading a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.errors import DataError

INPUTS = {"classification": ("text",), "pair": ("text_a", "text_b"), "token": ("text", "tokens"),
          "span": ("text", "tokens")}
"""Input columns per task kind; token and span tasks take `text` or pre-split `tokens`."""
TEXTS = ("text", "text_a", "text_b")
"""The input columns that hold raw text (each must hold some)."""


@dataclass(frozen=True)
class Limits:
    """What one call may hold, so that one request cannot take the server's memory: rows, and
    characters per text (a model reads only its first max_seq_len tokens anyway)."""

    max_rows: int = 1000
    """Rows per call (a REST request, a batch of `bertflow predict`)."""
    max_text_chars: int = 100_000
    """Characters per text, token lists joined."""

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, or BERTFLOW_MAX_ROWS and BERTFLOW_MAX_TEXT_CHARS where set (whoever
        serves the model sets them, e.g. for `mlflow models serve`)."""
        values = {}
        for field, var in (("max_rows", "BERTFLOW_MAX_ROWS"), ("max_text_chars", "BERTFLOW_MAX_TEXT_CHARS")):
            raw = os.environ.get(var, "").strip()
            if raw:
                if not raw.isdigit() or int(raw) < 1:
                    raise DataError(f"{var}={raw!r}: must be a positive whole number")
                values[field] = int(raw)
        return cls(**values)

    def check(self, rows: list[dict]) -> None:
        """DataError (HTTP 400 over REST) naming the first row or text over a limit."""
        if len(rows) > self.max_rows:
            raise DataError(f"{len(rows)} rows in one call; at most {self.max_rows} "
                            "(BERTFLOW_MAX_ROWS): send them in smaller batches")
        for i, row in enumerate(rows):
            if problem := self.text_over(row):
                raise DataError(f"row {i}: {problem}")

    def text_over(self, row: dict) -> str | None:
        """Which text of `row` is over max_text_chars, and by how much; None if none is."""
        for column in (*TEXTS, "tokens"):
            if (size := _chars(row.get(column))) > self.max_text_chars:
                return (f"column {column!r} holds {size:,} characters; at most {self.max_text_chars:,} "
                        "(BERTFLOW_MAX_TEXT_CHARS)")
        return None


def _chars(value: Any) -> int:
    """Characters of a text, or of a token list (a list or an array) joined by spaces."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple) or hasattr(value, "__array__"):
        return sum(len(str(t)) + 1 for t in value)
    return 0


def has_tokens(row: dict) -> bool:
    """Whether a row of a token or span task holds pre-split `tokens` (then `text` is unused)."""
    tokens = row.get("tokens")
    return tokens is not None and not (isinstance(tokens, float) and tokens != tokens)  # NaN: absent


def text_problem(row: dict, columns: Iterable[str]) -> str | None:
    """Why a text column of `columns` in `row` is no text to read (not a string, or blank), or
    None; `text` counts only where no pre-split `tokens` stand in for it."""
    for column in columns:
        if column not in TEXTS or column not in row or (column == "text" and has_tokens(row)):
            continue
        value = row[column]
        if not isinstance(value, str):
            return f"{column!r} must be a string, got {'null' if value is None else type(value).__name__}"
        if not value.strip():
            return f"{column!r} is empty or whitespace only"
    return None


def _names(columns: Iterable[str], joint: str = ", ") -> str:
    """Column names quoted and joined, for a message ("none" for none)."""
    return joint.join(map(repr, columns)) or "none"


def column_problem(got: Iterable[str], required: list[str], optional: list[str], strict: bool) -> str | None:
    """What is wrong with input columns `got` for a model whose signature names `required` and
    `optional` columns, or None: the missing ones (a model of optional columns only, as token
    and span models are, needs one of them), and the unknown ones. Unknown is, with `strict`,
    any column the model does not read (REST answers nothing else of a row, so it would be
    dropped unseen); else only one that a task model of another kind reads (`text_b` sent to a
    single-text model), the rest being carried along (`bertflow predict` writes it back). A
    model whose signature names no columns (not bertflow's) is left to MLflow's check."""
    got = list(got)
    if not required and not optional:
        return None
    reads = [*required, *optional]
    if required:
        missing = _names([c for c in required if c not in got]) if set(required) - set(got) else ""
        model = _names(required) + (f", and optionally {_names(optional)}" if optional else "")
    else:  # one of the optional columns is needed
        missing = _names(optional, " or ") if optional and not set(optional) & set(got) else ""
        model = _names(optional, " or ")
    unknown = [c for c in got if c not in reads and (strict or c in (*TEXTS, "tokens"))]
    said = ([f"missing column{'s' * (len(set(required) - set(got)) > 1)} {missing}"] if missing else []) + \
        ([f"unknown column{'s' * (len(unknown) > 1)} {_names(unknown)}"] if unknown else [])
    return f"{'; '.join(said)} (the model reads {model}; the input has {_names(got)})" if said else None


def check_columns(kind: str, columns: list[str]) -> None:
    """A clear error when the input lacks what the task kind reads."""
    need = INPUTS[kind]
    if kind in ("token", "span"):
        if not {"text", "tokens"} & set(columns):
            raise DataError(f"a {kind} model reads a `text` or a `tokens` column; got {columns}")
    elif missing := [c for c in need if c not in columns]:
        raise DataError(f"a {kind} model reads columns {list(need)}; missing {missing} (got {columns})")


def read_batches(path: Path, size: int) -> Iterator[list[dict]]:
    """Rows of a CSV or JSONL file, `size` at a time (the file is never read whole)."""
    for batch in read_numbered(path, size):
        yield [row for _, row in batch]


def read_numbered(path: Path, size: int) -> Iterator[list[tuple[str, dict]]]:
    """Rows of a CSV or JSONL file, `size` at a time, each with where it is for error messages:
    `line N` of a JSONL file, `row N` of a CSV file (counted from 1 after the header)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        yield from _read_csv(path, size)
        return
    if suffix not in (".jsonl", ".ndjson"):
        raise DataError(f"{path}: predict reads .csv or .jsonl files, not {suffix or 'no suffix'}")
    batch: list[tuple[str, dict]] = []
    with path.open("rb") as f:  # lines end at \n only: U+2028 inside a JSON string is text
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}, line {number}: not UTF-8 (byte {e.start + 1} of the "
                                "line)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}, line {number}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
            batch.append((f"line {number}", row))
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch


def _read_csv(path: Path, size: int) -> Iterator[list[tuple[str, dict]]]:
    """read_numbered for a CSV file, strictly: UTF-8, a header of distinct names, as many fields
    in every row as in the header (pandas would rename a repeated name, or take a row's extra
    leading fields for an index, and the model would read the wrong text)."""
    import csv

    try:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.reader(f, strict=True)
            header = next(reader, None)
            if header is None:
                raise DataError(f"{path}: empty, not even a header")
            if repeated := sorted({name for name in header if header.count(name) > 1}):
                raise DataError(f"{path}: the header names {', '.join(map(repr, repeated))} more than once")
            batch: list[tuple[str, dict]] = []
            for number, row in enumerate(reader, 1):
                if not row:  # a blank line: a row of empty cells (refused later), not one answer fewer
                    row = [""] * len(header)
                if len(row) != len(header):
                    raise DataError(f"{path}, row {number}: {len(row)} fields, the header has {len(header)}")
                batch.append((f"row {number}", dict(zip(header, row, strict=True))))
                if len(batch) == size:
                    yield batch
                    batch = []
            if batch:
                yield batch
    except UnicodeDecodeError:
        raise DataError(f"{path}, line {_first_bad_line(path)}: not UTF-8") from None
    except csv.Error as e:
        raise DataError(f"{path}, line {reader.line_num}: not well-formed CSV ({e})") from None


def _first_bad_line(path: Path) -> int:
    """The number of the first line of `path` that is not UTF-8."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0
