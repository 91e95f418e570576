"""The task model of a start: its first seed's fit, exported (model.metadata.TaskModelInfo) to
`model/`, and for a start of finetune.onnx also as ONNX, int8 where it answers the test split as
fp32."""

from __future__ import annotations

import logging

import torch

from components.evaluation.metrics import primary_metric
from components.model.folders import write_task_model
from components.model.metadata import TaskModelInfo
from components.model.onnx_model import ONNX_DIR, write_onnx
from components.training.finetune_module import FitSpec, score
from components.training.plan import FitPlan

log = logging.getLogger(__name__)


def export_fit(model: torch.nn.Module, plan: FitPlan, spec: FitSpec, fit: str, test: list,
               threshold: float | None) -> None:
    """Write fit `fit` (its model and its test predictions `test`) as the start's task model."""
    task, cfg, origin = plan.task, plan.cfg, plan.start
    info = TaskModelInfo(config=origin.bert, task=task, fit=fit, labels=plan.labels, space=spec.space,
                         max_seq_len=origin.max_len, label_subwords=cfg.label_subwords,
                         crf=getattr(model, "crf", None) is not None, threshold=threshold, scheme=plan.scheme)
    write_task_model(model, info, origin.tokenizer_dir, plan.out / "model")
    if origin.init not in cfg.onnx:
        return
    metric = (primary_metric(task.kind, plan.scheme),
              lambda found: score(task.kind, spec.space, found, plan.test_gold, plan.scheme))
    check = write_onnx(model, task.kind, spec.space, origin.encoded["test"], test, metric, origin.max_len,
                       plan.out / "model" / ONNX_DIR, cfg.batch_size * 2, span_decoding=task.span_decoding,
                       threshold=threshold, tag_decoding=task.tag_decoding)
    log.info("finetune %s: int8 answers as fp32 on %.2f%% of the test split, %s %.4f vs %.4f%s",
             plan.name, 100 * check["agreement"], check["metric"], check["int8"], check["fp32"],
             f"; int8 refused: {check['refused']}" if check["refused"] else "")
