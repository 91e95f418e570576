"""Stage `finetune@task`: every fit of a task, from each init of `finetune.init` (the pretrained
encoder, random weights, an imported checkpoint) and each seed.

Examples are encoded once (the tokenizer of the encoder), batched by length so that short
sentences are not padded to the longest of the split, and kept in memory (tasks are small).
Validation runs a few times per epoch; early stopping and the best weights follow the task's
primary metric (accuracy; entity F1 for BIO token and span tasks; word accuracy for plain
tags). Each fit writes its test predictions to `fits/`; `evaluate@task` scores them. The first
init's first seed is exported as the task's model (model.metadata.TaskModelInfo).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader

from components.core.config import FinetuneConfig, TaskConfig
from components.core.errors import ConfigError, DataError
from components.core.io import atomic_dir, write_json
from components.core.progress import bar
from components.data.tasks.folder import read_meta, read_split
from components.model.config import BertConfig, shape_of
from components.model.decoding import predict, predictions_table
from components.model.folders import load_tokenizer, read_weights, write_task_model
from components.model.inputs import Encoded, encode, label_space
from components.model.metadata import TaskModelInfo, read_checkpoint_info, read_encoder_info
from components.training.batching import Batches
from components.training.common import resolve_precision
from components.training.finetune_module import FinetuneModule, FitSpec, score
from components.training.workers import map_in_processes, worker_count

log = logging.getLogger(__name__)


@dataclass
class TaskFits:
    """Everything the fits of one task share: shipped once to each worker process."""

    name: str
    task: TaskConfig
    cfg: FinetuneConfig
    bert: BertConfig
    labels: list[str]
    scheme: str  # token and span tasks: bio or plain (meta.json's); "" for text tasks
    encoder_dir: Path
    weights: dict[str, Path | None]  # init -> the encoder folder it starts from
    out: Path  # the stage's temporary output folder
    encoded: dict[str, list[Encoded]]
    valid_gold: pa.Table
    max_len: int  # tokens per example, as resolved for this task
    epochs: int  # the task's, else finetune's
    lr: float  # the task's, else finetune's


def finetune_task(name: str, task: TaskConfig, cfg: FinetuneConfig, task_dir: Path,
                  encoder_dir: Path, out_dir: Path, checkpoint_dir: Path | None = None) -> dict:
    """Every fit of one task (each init of `cfg.init`, each seed): test predictions and
    validation curves per fit, and the exported first fit of the first init."""
    if not (Path(encoder_dir) / "bertflow.json").exists():
        raise DataError(f"{encoder_dir}: no pretrained encoder; run the pretrain stage first")
    meta = read_meta(task_dir)
    if meta["kind"] != task.kind:
        raise DataError(f"{task_dir}: holds {meta['kind']} data, but task {name} is {task.kind}")
    encoder = read_encoder_info(encoder_dir)
    bert = encoder.config
    tokenizer = load_tokenizer(encoder_dir, bert)
    read_weights(Path(encoder_dir) / "model.safetensors")  # fail now, not in every fit's process
    weights = {"pretrained": Path(encoder_dir), "scratch": None, "checkpoint": checkpoint_dir}
    if "checkpoint" in cfg.init:
        _check_same_shape(checkpoint_dir, bert, encoder_dir)
    max_len = min(task.max_seq_len or cfg.max_seq_len, bert.max_position)
    epochs, lr = task.epochs or cfg.epochs, task.lr or cfg.lr
    splits = {s: read_split(task_dir, s) for s in ("train", "valid", "test")}
    encoded = {s: encode(t, task.kind, tokenizer, meta["labels"], max_len, task.long_text,
                         cfg.label_subwords, task.max_span_words, meta.get("scheme", ""),
                         task.chunk_overlap)
               for s, t in splits.items()}
    fits = [(init, seed) for init in cfg.init for seed in cfg.seeds]
    # What the encoder's pretraining reached: the transfer table flags a run cut short by a guard.
    stats: dict = {"kind": task.kind, "labels": len(meta["labels"]), "max_seq_len": max_len,
                   "lr": lr, "epochs": epochs,
                   **({"scheme": meta["scheme"]} if "scheme" in meta else {}),
                   "train_examples": splits["train"].num_rows, "fits": {},
                   **({"train_windows": len(encoded["train"])} if task.long_text == "chunks" else {}),
                   "encoder": {k: encoder.stats[k] for k in ("steps", "max_steps", "stopped_by")
                               if k in encoder.stats}}
    with atomic_dir(out_dir) as tmp:
        (tmp / "fits").mkdir()
        shared = TaskFits(name, task, cfg, bert, meta["labels"], meta.get("scheme", ""), Path(encoder_dir),
                          weights, tmp, encoded, splits["valid"], max_len, epochs, lr)
        workers = worker_count(cfg.workers, len(fits))
        if workers == 1:
            summaries = [fit_and_predict(shared, init, seed)
                         for init, seed in bar(fits, f"finetune {name}", len(fits), "fit")]
        else:
            summaries = map_in_processes(fit_and_predict, shared, fits, workers, f"finetune {name}")
        # Wall minutes and the worker count describe this execution, not the models: MLflow only.
        this_run: dict = {"workers": workers}
        for summary in summaries:
            fit_name = f"{summary['init']}-s{summary['seed']}"
            stats["fits"][fit_name] = {k: summary[k] for k in ("steps", "best_val_metric")}
            this_run[f"{fit_name}.minutes"] = summary["minutes"]
        stats["this_run"] = this_run
        shutil.rmtree(tmp / "work", ignore_errors=True)
    return stats


def _check_same_shape(checkpoint_dir: Path | None, bert: BertConfig, encoder_dir: Path) -> None:
    """The `checkpoint` arm shares the encoder's tokenizer and shape: it must be its start."""
    info = read_checkpoint_info(checkpoint_dir) if checkpoint_dir is not None else None
    if info is None or info.config is None:
        raise ConfigError("finetune.init has checkpoint, but no checkpoint was imported "
                          "(pretrain.init_from is empty)")
    ours, theirs = shape_of(bert), shape_of(info.config)
    if ours != theirs:
        raise DataError(f"finetune.init checkpoint: {checkpoint_dir} ({theirs}) is not the shape "
                        f"of the encoder {encoder_dir} ({ours}); rerun the pretrain stage")


def fit(spec: FitSpec, bert: BertConfig, cfg: FinetuneConfig, weights: Path | None,
        train: list[Encoded], valid: list[Encoded], valid_gold: pa.Table, work: Path):
    """Train one fit with early stopping, from the encoder in `weights` (None: random weights);
    return the model at its best validation pass, the validation history and the steps."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    L.seed_everything(spec.seed, workers=True, verbose=False)
    data = Batches(train, spec.kind, cfg.batch_size, spec.seed)
    steps = len(data)
    module = FinetuneModule(spec, bert, cfg, weights, valid, valid_gold, steps)
    # Validation a few times per epoch (not on a partial last interval): early stopping and
    # the best weights see the model as it improves, not only at epoch ends.
    interval = max(1, steps // cfg.evals_per_epoch)
    best = ModelCheckpoint(dirpath=work, monitor="val/metric", mode="max", save_top_k=1,
                           save_weights_only=True, filename="best")
    trainer = L.Trainer(
        accelerator="auto", devices=1, precision=resolve_precision("auto"), max_epochs=spec.epochs,
        val_check_interval=interval, num_sanity_val_steps=0, limit_val_batches=1,
        gradient_clip_val=1.0, logger=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=cfg.deterministic,
        callbacks=[best, EarlyStopping("val/metric", mode="max", patience=cfg.patience)],
    )
    trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=None),
                val_dataloaders=DataLoader(Batches(valid[:1], spec.kind, 1, None), batch_size=None))
    state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    module.load_state_dict(state)
    return module.model.cpu().eval(), module.history, trainer.global_step


def fit_and_predict(shared: TaskFits, init: str, seed: int) -> dict:
    """One fit: train, predict the test split, write `fits/<init>-s<seed>.{parquet,json}`; the
    first init's first seed is also exported as the task's model."""
    task, cfg, encoded = shared.task, shared.cfg, shared.encoded
    space = label_space(task.kind, shared.labels, shared.scheme)
    name = f"{init}-s{seed}"
    spec = FitSpec(task.kind, space, init, seed, shared.epochs, shared.lr, task.max_span_words,
                   task.span_decoding, shared.scheme)
    start = time.perf_counter()
    model, history, steps = fit(spec, shared.bert, cfg, shared.weights[init], encoded["train"],
                                encoded["valid"], shared.valid_gold, shared.out / "work" / name)
    threshold = None
    if task.kind == "span" and cfg.span_threshold:
        threshold = calibrate_threshold(model, spec, encoded["valid"], shared.valid_gold, cfg.batch_size * 2)
    test = predict(model, task.kind, encoded["test"], space, cfg.batch_size * 2, task.span_decoding,
                   threshold)
    pq.write_table(predictions_table(task.kind, test), shared.out / "fits" / f"{name}.parquet")
    best = max((h["val_metric"] for h in history), default=float("nan"))
    summary = {"init": init, "seed": seed, "steps": steps, "best_val_metric": best,
               "threshold": threshold, "history": history}
    write_json(shared.out / "fits" / f"{name}.json", summary)  # a DVC output: no wall time in it
    summary["minutes"] = (time.perf_counter() - start) / 60
    log.info("finetune %s %s: best validation %.4f in %d steps, %.1f min", shared.name, name, best,
             steps, summary["minutes"])
    if init == cfg.init[0] and seed == cfg.seeds[0]:
        info = TaskModelInfo(config=shared.bert, task=task, fit=name, labels=shared.labels, space=space,
                             max_seq_len=shared.max_len, label_subwords=cfg.label_subwords,
                             crf=getattr(model, "crf", None) is not None, threshold=threshold,
                             scheme=shared.scheme)
        write_task_model(model, info, shared.encoder_dir, shared.out / "model")
    return summary


def calibrate_threshold(model, spec: FitSpec, valid: list[Encoded], gold: pa.Table, batch_size: int) -> float:
    """The span score threshold with the best validation F1 (a grid over (0, 1))."""
    grid = [round(t, 2) for t in np.arange(0.1, 0.95, 0.05)]
    scores = {t: score(spec.kind, spec.space, predict(model, spec.kind, valid, spec.space, batch_size,
                                                      spec.span_decoding, t), gold, spec.scheme)
              for t in grid}
    return max(scores, key=scores.get)
