"""Predictions on raw text from an exported task model (what `finetune@task` writes to
`data/models/tasks/<task>/model`): the one inference path of the pyfunc model, `bertflow
predict`, the REST server and the throughput benchmark.

Inputs go through the same `encode` and `predict` as the test split in fine-tuning, so a served
model answers exactly as it was scored. Batches are length-bucketed (no padding waste).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from components.core.errors import DataError
from components.data.tags import bio_to_spans
from components.model.build import task_model
from components.model.decoding import predict
from components.model.folders import load_tokenizer, read_weights
from components.model.inputs import encode
from components.model.metadata import TaskModelInfo, read_task_model_info

# Words of raw text for token and span tasks: runs of letters/digits (with inner - ' ’ .), or
# one other non-space character, the way CoNLL splits "U.S.-led" or "(Reuters)".
WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")

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
            for column in (*TEXTS, "tokens"):
                if (size := _chars(row.get(column))) > self.max_text_chars:
                    raise DataError(f"row {i}: column {column!r} holds {size:,} characters; at most "
                                    f"{self.max_text_chars:,} (BERTFLOW_MAX_TEXT_CHARS)")


def _chars(value: Any) -> int:
    """Characters of a text, or of a token list (a list or an array) joined by spaces."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple) or hasattr(value, "__array__"):
        return sum(len(str(t)) + 1 for t in value)
    return 0


@dataclass
class TaskModel:
    """An exported task model, loaded for prediction: its record, the head, the tokenizer."""

    info: TaskModelInfo
    model: Any  # the torch head in eval mode
    tokenizer: Any
    limits: Limits = Limits()

    @property
    def kind(self) -> str:
        """The task kind, which selects the inputs and the shape of the answers."""
        return self.info.task.kind


def load_task_model(model_dir: Path) -> TaskModel:
    """Weights (safetensors), config, tokenizer and label map of an exported task model."""
    model_dir = Path(model_dir)
    info = read_task_model_info(model_dir)
    model = task_model(info.config, info.task.kind, info.space, info.crf, info.task.max_span_words)
    model.load_state_dict(read_weights(model_dir / "model.safetensors"))
    model.eval()  # predict() runs under no_grad
    return TaskModel(info, model, load_tokenizer(model_dir, info.config), Limits.from_env())


def split_words(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Words of raw text and their character offsets."""
    matches = list(WORD.finditer(text))
    return [m.group() for m in matches], [m.span() for m in matches]


def _offsets(tokens: list[str]) -> list[tuple[int, int]]:
    """Character offsets of pre-split tokens in their text joined by single spaces."""
    out, pos = [], 0
    for t in tokens:
        out.append((pos, pos + len(t)))
        pos += len(t) + 1
    return out


def _text(value: Any, column: str, row: int) -> str:
    """Row `row`'s `column`, checked to be a string with some text in it."""
    if not isinstance(value, str):
        raise DataError(f"row {row}: column {column!r} must be a string, got {type(value).__name__}")
    # A model answers an empty text with a confident-looking label (whatever [CLS] [SEP] gives):
    # refused, like a missing one.
    if not value.strip():
        raise DataError(f"row {row}: column {column!r} is empty or whitespace only")
    return value


def _has_tokens(row: dict) -> bool:
    """Whether a row of a token or span task holds pre-split `tokens` (then `text` is unused)."""
    tokens = row.get("tokens")
    return tokens is not None and not (isinstance(tokens, float) and tokens != tokens)  # NaN: absent


def blank_column(row: dict, columns: Iterable[str]) -> str | None:
    """The first text column of `columns` that `row` holds as an empty or whitespace-only
    string, or None; `text` counts only where no pre-split `tokens` stand in for it."""
    for column in columns:
        value = row.get(column)
        if column in TEXTS and isinstance(value, str) and not value.strip() \
                and not (column == "text" and _has_tokens(row)):
            return column
    return None


def _words(row: dict, i: int) -> tuple[list[str], list[tuple[int, int]], str]:
    """Words, their offsets and the text they are offsets into, from `tokens` or `text`."""
    if _has_tokens(row):
        tokens = [str(t) for t in row["tokens"]]
        if not tokens or any(not t or t.isspace() for t in tokens):
            raise DataError(f"row {i}: `tokens` must be a non-empty list of non-blank strings")
        return tokens, _offsets(tokens), " ".join(tokens)
    text = _text(row.get("text"), "text", i)
    words, offsets = split_words(text)
    return words, offsets, text


def check_columns(kind: str, columns: list[str]) -> None:
    """A clear error when the input lacks what the task kind reads."""
    need = INPUTS[kind]
    if kind in ("token", "span"):
        if not {"text", "tokens"} & set(columns):
            raise DataError(f"a {kind} model reads a `text` or a `tokens` column; got {columns}")
    elif missing := [c for c in need if c not in columns]:
        raise DataError(f"a {kind} model reads columns {list(need)}; missing {missing} (got {columns})")


def predict_rows(tm: TaskModel, rows: list[dict], batch_size: int = 64) -> list[dict]:
    """One answer per input row: {label, score} for classification and pairs; {tokens, tags,
    entities} for token tasks ({tokens, tags} for plain tags); {tokens, spans} for span tasks.
    An entity or span is {start, end (word indices, end exclusive), label, start_char, end_char,
    text} and, for spans, a score."""
    if not rows:
        return []
    tm.limits.check(rows)
    check_columns(tm.kind, sorted({k for row in rows for k in row}))
    info, task = tm.info, tm.info.task
    if tm.kind in ("classification", "pair"):
        columns = {c: [_text(r.get(c), c, i) for i, r in enumerate(rows)] for c in INPUTS[tm.kind]}
        # encode() reads gold labels too: any known label stands in, it is not used.
        table = pa.table({**columns, "label": [info.labels[0]] * len(rows)})
        examples = encode(table, tm.kind, tm.tokenizer, info.labels, info.max_seq_len, task.long_text)
        found = predict(tm.model, tm.kind, examples, info.space, batch_size)
        return [{"label": label, "score": score} for label, score in found]
    words = [_words(row, i) for i, row in enumerate(rows)]
    stand_in = info.labels[0] if info.scheme == "plain" else "O"  # gold tags encode() reads, unused
    table = pa.table({"tokens": [w for w, _, _ in words],
                      "tags": [[stand_in] * len(w) for w, _, _ in words]})
    examples = encode(table, tm.kind, tm.tokenizer, info.labels, info.max_seq_len,
                      label_subwords=info.label_subwords, max_span_words=task.max_span_words,
                      scheme=info.scheme)
    found = predict(tm.model, tm.kind, examples, info.space, batch_size, task.span_decoding, info.threshold)
    if tm.kind == "token" and info.scheme == "plain":
        return [{"tokens": w, "tags": tags} for (w, _, _), tags in zip(words, found, strict=True)]
    if tm.kind == "token":
        return [{"tokens": w, "tags": tags, "entities": _entities(
                    [(a, b, label, None) for a, b, label in bio_to_spans(tags)], offsets, text)}
                for (w, offsets, text), tags in zip(words, found, strict=True)]
    return [{"tokens": w, "spans": _entities(spans, offsets, text)}
            for (w, offsets, text), spans in zip(words, found, strict=True)]


def _entities(spans: list[tuple], offsets: list[tuple[int, int]], text: str) -> list[dict]:
    """Word spans (first, end exclusive, label, score or None) with their character offsets."""
    out = []
    for a, b, label, score in spans:
        start, end = offsets[a][0], offsets[b - 1][1]
        entity = {"start": a, "end": b, "label": label, "start_char": start, "end_char": end,
                  "text": text[start:end]}
        if score is not None:
            entity["score"] = score
        out.append(entity)
    return out


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
