"""`bertflow predict`'s rows: read from the options or a file, checked, answered by the model
(pipeline.model_loading loads it), written as JSON lines."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from components.core.errors import BertflowError, ConfigError, DataError
from components.lifecycle.rows import Limits


def check_options(text: list[str] | None, text_b: list[str] | None, file: Path | None,
                  batch_size: int) -> Limits:
    """Refuse input options that cannot make rows, before any model is fetched; the limits
    the rows are checked against."""
    if (file is None) == (not text):
        raise ConfigError("give --text (one or more) or --file")
    if text_b and len(text_b) != len(text or []):
        raise ConfigError("give one --text-b per --text")
    for option, values in (("--text", text), ("--text-b", text_b)):
        if blank := [str(i) for i, value in enumerate(values or [], 1) if not value.strip()]:
            raise ConfigError(f"{option} {', '.join(blank)} of {len(values)}: empty or whitespace-only text")
    limits = Limits.from_env()  # the model's, checked here too to name where a row is
    if batch_size > limits.max_rows:  # else the first full batch fails, late
        raise ConfigError(f"--batch-size {batch_size}: a model call holds at most {limits.max_rows} rows "
                          "(BERTFLOW_MAX_ROWS); give a smaller one")
    return limits


def predict_rows(pyfunc, task: str, text: list[str] | None, text_b: list[str] | None,
                 file: Path | None, out: Path | None, batch_size: int, limits: Limits) -> None:
    """One JSON line per input row, to `out` (whole or not at all) or stdout."""
    import json

    import pandas as pd

    from components.core.io import atomic_file
    from components.core.progress import bar
    from components.lifecycle.rows import TEXTS, column_problem, read_numbered, text_problem

    # Rows are checked before the model runs, each named by where it is in the input: MLflow's
    # schema check would name none, and drop a text column the model does not read unsaid.
    required, optional = _input_columns(pyfunc)
    reads = [*required, *optional] or list(TEXTS)
    if file is None:
        _check_text_options(required, optional, bool(text_b))
        rows = [{"text_a": a, "text_b": b} for a, b in zip(text, text_b, strict=True)] if text_b \
            else [{"text": t} for t in text]
        batches = iter([[(f"--text {i}", row) for i, row in enumerate(rows, 1)]])
    else:
        batches = read_numbered(file, batch_size)
    with contextlib.ExitStack() as stack:
        if out is None:
            sink = sys.stdout
        else:  # written whole or not at all
            sink = stack.enter_context(stack.enter_context(atomic_file(out)).open("w", encoding="utf-8"))
        for numbered in bar(batches, f"predict {task}", unit="batch"):
            for place, row in numbered:
                where = f"{file}, {place}" if file else place
                # a CSV file's columns are its header's: the file is at fault, not a row
                if problem := column_problem(row, required, optional, strict=False):
                    raise DataError(f"{file if file and file.suffix.lower() == '.csv' else where}: {problem}")
                if problem := text_problem(row, reads) or limits.text_over(row):
                    raise DataError(f"{where}: {problem}")
            rows = [row for _, row in numbered]
            # Only what the model reads goes in (the rest is written back as it came).
            frame = pd.DataFrame([{c: r[c] for c in reads if c in r} for r in rows] if required or optional
                                 else rows)
            for row, answer in zip(rows, _answers(pyfunc, frame, file), strict=True):
                sink.write(json.dumps({**row, **answer}, ensure_ascii=False) + "\n")


def _input_columns(pyfunc) -> tuple[list[str], list[str]]:
    """The required and optional input columns the model's signature names (none, if its
    signature names none: a model not of bertflow's, whose input MLflow alone checks)."""
    schema = pyfunc.metadata.get_input_schema()
    if schema is None or not schema.has_input_names():
        return [], []
    return list(schema.required_input_names()), list(schema.optional_input_names())


def _check_text_options(required: list[str], optional: list[str], pairs: bool) -> None:
    """--text (with --text-b, a pair) against what the model reads, in the options' own words."""
    reads = {*required, *optional}
    if not reads:
        return
    if pairs and not {"text_a", "text_b"} <= reads:
        raise ConfigError(f"--text-b: the model reads {', '.join(map(repr, [*required, *optional]))}, "
                          "not pairs of texts: give --text alone")
    if not pairs and "text" not in reads and {"text_a", "text_b"} <= reads:
        raise ConfigError("the model reads pairs of texts ('text_a', 'text_b'): give a --text-b "
                          "with each --text")


def _answers(pyfunc, frame, file: Path | None) -> list[dict]:
    """The model's answers to a batch; input it refuses (as the REST server answers 400) is
    one clear line, not a traceback."""
    from mlflow.exceptions import MlflowException

    try:
        return pyfunc.predict(frame)
    except MlflowException as e:
        where = f"{file}: " if file else ""
        # MLflow's schema errors quote the whole batch first and their cause last
        cause = e.message.rpartition("Error: ")[2].strip() or e.message.strip()
        raise BertflowError(f"{where}{(cause.splitlines() or ['the model refused the input'])[0]}") from None
