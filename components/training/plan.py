"""What the fits of one start share (shipped once to each worker process): the start's weights
and encoded examples, the task and its labels, where the fits go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from components.core.config import FinetuneConfig, TaskConfig
from components.model.config import BertConfig
from components.model.inputs import Encoded


@dataclass(frozen=True, kw_only=True)
class Start:
    """What the fits of one start begin from."""

    init: str  # the start's name: pretrained, scratch, checkpoint, adapted, distilled, teacher
    weights: Path | None  # the encoder folder whose weights it loads; None: random weights
    bert: BertConfig
    tokenizer_dir: Path  # exported with the task model
    encoded: dict[str, list[Encoded]]  # "train" (the transfer set for a student), "valid", "test"
    max_len: int  # tokens per example, as resolved for this task and encoder


@dataclass(frozen=True, kw_only=True)
class FitPlan:
    """Everything the fits of one start share: shipped once to each worker process."""

    name: str  # the task's
    task: TaskConfig
    cfg: FinetuneConfig
    labels: list[str]
    scheme: str  # token and span tasks: bio or plain (meta.json's); "" for text tasks
    start: Start
    out: Path  # the stage's temporary output folder
    valid_gold: pa.Table
    test_gold: pa.Table | None  # the ONNX int8 check's (finetune.onnx); None in the probe
    first_seed: int  # its fit is exported as the task model
    distill: tuple[float, float] | None = None  # a student's (temperature, alpha)
