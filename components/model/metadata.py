"""The record (`bertflow.json`) of each model folder the pipeline writes, typed, and read and
written here only. Three layouts, one dataclass each:
  CheckpointInfo  the checkpoint stage's output: the public checkpoint `pretrain.init_from`
                  names, in the pipeline's layout (or no checkpoint at all)
  EncoderInfo     the pretrain stage's export: the encoder for fine-tuning and exploring
  TaskModelInfo   a fine-tuned task model: what encoding and decoding raw text need
What else a folder holds (weights, tokenizer, transformers' config) is model/folders.py's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from components.core.config import TaskConfig
from components.core.errors import DataError
from components.core.io import write_json
from components.core.params import parse
from components.model.config import MODERN_DEFAULTS, BertConfig

INFO_FILE = "bertflow.json"


@dataclass
class CheckpointInfo:
    """bertflow.json of the checkpoint stage's output."""

    init_from: str
    """What pretrain.init_from named; empty: no checkpoint (the folder holds only this file)."""
    config: BertConfig | None = None
    """The checkpoint's shape."""
    source: str = ""
    """The folder it was read from (relative to the project when inside it)."""
    source_sha256: str = ""
    """Hash of the source's model.safetensors."""
    fresh_heads: list[str] = field(default_factory=list)
    """Pretraining heads the checkpoint lacks (pooler, mlm, nsp): they start fresh."""
    parameters: int = 0
    """Parameters of the pretraining model, fresh heads included."""


@dataclass
class EncoderInfo:
    """bertflow.json of the pretrain stage's export."""

    config: BertConfig
    """The encoder's shape, with the dropout fine-tuning uses."""
    init_from: str = ""
    """The checkpoint pretraining continued from; empty: pretrained from random weights."""
    stats: dict[str, Any] = field(default_factory=dict)
    """The pretrain stage's final stats."""
    history: list[dict] = field(default_factory=list)
    """Held-out metrics at each evaluation."""


@dataclass
class TaskModelInfo:
    """bertflow.json of an exported task model."""

    config: BertConfig
    """The encoder's shape."""
    task: TaskConfig
    """The task's settings (kind, long_text, span decoding...)."""
    fit: str
    """The fit exported (`INIT-sSEED`)."""
    labels: list[str]
    """The task's labels (classes, entity types, or plain tags)."""
    space: list[str]
    """What the head predicts, by output index (labels, BIO or plain tags, or NULL + types)."""
    max_seq_len: int
    """Tokens per example, as the model was trained."""
    label_subwords: str
    """Token tasks: which subwords carried labels in training."""
    crf: bool
    """Token tasks: a CRF decodes the emissions."""
    threshold: float | None = None
    """Span tasks: the calibrated score threshold, if any."""
    scheme: str = ""
    """Token and span tasks: the tag scheme, bio (entities) or plain (a tag per word)."""


def _read(folder: Path, what: str) -> dict:
    path = Path(folder) / INFO_FILE
    if not path.exists():
        raise DataError(f"{path}: missing; {what}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e}); the model folder is damaged") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: not a record of this pipeline (a JSON object is expected)")
    return data


def _record(cls: type, folder: Path, data: dict, **typed: Any):
    """`cls` from a record's fields (keys it doesn't know, from older versions, are ignored), the
    nested ones given typed; a missing field is an error that names the file."""
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{**{k: v for k, v in data.items() if k in known}, **typed})
    except (TypeError, KeyError) as e:
        raise DataError(f"{Path(folder) / INFO_FILE}: not a complete {cls.__name__} ({e})") from None


# What a record written before ELECTRA and model.arch existed was: a classic encoder without
# an RTD head.
EARLIER = {"rtd": False, "arch": "classic", **MODERN_DEFAULTS}


def _config(folder: Path, data: dict) -> BertConfig:
    try:
        return BertConfig(**{**EARLIER, **data["config"]})
    except (TypeError, KeyError) as e:
        raise DataError(f"{Path(folder) / INFO_FILE}: no valid encoder config ({e})") from None


def read_checkpoint_info(folder: Path, expect: str | None = None) -> CheckpointInfo:
    """The checkpoint stage's record; with `expect`, it must hold that checkpoint (a stale
    output is an error, not a silent swap)."""
    data = _read(folder, "run the checkpoint stage first")
    info = _record(CheckpointInfo, folder, data, config=_config(folder, data) if data.get("config") else None)
    if expect is not None and info.init_from != expect:
        raise DataError(f"{folder} holds checkpoint {info.init_from!r}, but pretrain.init_from is "
                        f"{expect!r}; run the checkpoint stage first")
    return info


def read_encoder_info(folder: Path) -> EncoderInfo:
    """The record of an exported encoder."""
    data = _read(folder, "not an exported encoder; run the pretrain stage, or name a folder it wrote")
    return _record(EncoderInfo, folder, data, config=_config(folder, data))


def read_task_model_info(folder: Path) -> TaskModelInfo:
    """The record of an exported task model."""
    data = _read(folder, "not an exported task model")
    id2label = data.get("id2label", {})
    space = [id2label.get(str(i)) for i in range(len(id2label))]
    task = parse(TaskConfig, _current_task(data), f"{Path(folder) / INFO_FILE}:task.")
    # Models registered before these fields existed keep working: `fit` was `run`, and every
    # token and span model was BIO.
    return _record(TaskModelInfo, folder, data, config=_config(folder, data), space=space, task=task,
                   fit=data.get("fit", data.get("run", "")),
                   scheme=data.get("scheme", "bio" if task.kind in ("token", "span") else ""))


def _current_task(data: dict) -> object:
    """A record's task in today's schema. Records written before finetune.task_defaults kept a
    rate apart from its grid and 0 for "finetune's value": the rates become one list, the length
    the record's own max_seq_len, and a 0 that only training read (epochs, patience, a rate) the
    least the schema takes; serving reads none of those."""
    task = data.get("task")
    if not isinstance(task, dict) or "lr_grid" not in task:
        return task
    task = dict(task)
    grid, lr, teacher = task.pop("lr_grid"), task.get("lr"), task.get("teacher_lr")
    task.update(lr=grid or [lr or 1.0], teacher_lr=[teacher or 1.0],
                max_seq_len=task.get("max_seq_len") or data.get("max_seq_len"),
                epochs=task.get("epochs") or 1, patience=task.get("patience") or 1)
    return task


def write_info(folder: Path, info: CheckpointInfo | EncoderInfo | TaskModelInfo) -> None:
    """bertflow.json of a model folder (a task model's output space as transformers' id2label)."""
    data = asdict(info)
    if isinstance(info, TaskModelInfo):
        data["task"] = info.task.model_dump()
        data["id2label"] = dict(enumerate(data.pop("space")))  # JSON keys "0", "1", ... in order
    if isinstance(info, CheckpointInfo) and not info.init_from:
        data = {"init_from": ""}  # no checkpoint: nothing else to say
    write_json(Path(folder) / INFO_FILE, data)
