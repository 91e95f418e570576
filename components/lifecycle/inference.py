"""Predictions on raw text from an exported task model (what a start's stage, `finetune@task-start`
or `distill@task`, writes to `data/models/tasks/<task>/<start>/model`): the one inference path of
the pyfunc model, `bertflow predict`, the REST server and the throughput benchmark.

Inputs go through the same `encode` and `predict` as the test split in fine-tuning, so a served
model answers exactly as it was scored. Batches are length-bucketed (no padding waste).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from components.core.errors import ConfigError, DataError
from components.data.tags import bio_to_spans
from components.data.text import split_words
from components.lifecycle.backends import BACKENDS
from components.lifecycle.rows import INPUTS, Limits, check_columns, has_tokens
from components.model.build import task_model
from components.model.decoding import predict
from components.model.folders import load_tokenizer, read_weights
from components.model.inputs import encode
from components.model.metadata import TaskModelInfo, read_task_model_info
from components.model.onnx_model import OnnxHead, onnx_file


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


def load_task_model(model_dir: Path, backend: str = "torch") -> TaskModel:
    """Weights (safetensors), config, tokenizer and label map of an exported task model; with
    backend `onnx` or `onnx-int8`, its ONNX graph in ONNX Runtime (the CRF, if any, in torch)."""
    model_dir = Path(model_dir)
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    info = read_task_model_info(model_dir)
    model = task_model(info.config, info.task.kind, info.space, info.crf, info.task.max_span_words)
    model.load_state_dict(read_weights(model_dir / "model.safetensors"))
    model.eval()  # predict() runs under no_grad
    if backend != "torch":
        model = OnnxHead(onnx_file(model_dir, backend), getattr(model, "crf", None))
    return TaskModel(info, model, load_tokenizer(model_dir, info.config), Limits.from_env())


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


def _words(row: dict, i: int) -> tuple[list[str], list[tuple[int, int]], str]:
    """Words, their offsets and the text they are offsets into, from `tokens` or `text`."""
    if has_tokens(row):
        tokens = [str(t) for t in row["tokens"]]
        if not tokens or any(not t or t.isspace() for t in tokens):
            raise DataError(f"row {i}: `tokens` must be a non-empty list of non-blank strings")
        return tokens, _offsets(tokens), " ".join(tokens)
    text = _text(row.get("text"), "text", i)
    words, offsets = split_words(text)
    return words, offsets, text


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
        examples = encode(table, tm.kind, tm.tokenizer, info.labels, info.max_seq_len, task.long_text,
                          chunk_overlap=task.chunk_overlap)
        found = predict(tm.model, tm.kind, examples, info.space, batch_size)
        return [{"label": label, "score": score} for label, score in found]
    words = [_words(row, i) for i, row in enumerate(rows)]
    stand_in = info.labels[0] if info.scheme == "plain" else "O"  # gold tags encode() reads, unused
    table = pa.table({"tokens": [w for w, _, _ in words],
                      "tags": [[stand_in] * len(w) for w, _, _ in words]})
    examples = encode(table, tm.kind, tm.tokenizer, info.labels, info.max_seq_len,
                      label_subwords=info.label_subwords, max_span_words=task.max_span_words,
                      scheme=info.scheme)
    found = predict(tm.model, tm.kind, examples, info.space, batch_size, task.span_decoding, info.threshold,
                    task.tag_decoding)
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


