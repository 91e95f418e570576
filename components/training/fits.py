"""One fit of a task, and fits side by side: train with early stopping (Lightning), predict the
test split, write `fits/<init>-s<seed>.{parquet,json}`; the start's first seed is also exported
as a task model (training/export.py).

Examples are encoded once per start and shipped once to each worker process (training/plan.py);
validation runs a few times per epoch, and
early stopping and the best weights follow the task's primary metric.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader

from components.core.config import FinetuneConfig
from components.core.io import write_json
from components.core.machine import cpu_facts
from components.core.progress import bar
from components.model.build import task_model
from components.model.config import BertConfig
from components.model.decoding import predict, predictions_table
from components.model.inputs import Encoded, label_space
from components.training.batching import Batches
from components.training.export import export_fit
from components.training.finetune_module import FinetuneModule, FitSpec, score
from components.training.plan import FitPlan
from components.training.precision import resolve_precision
from components.training.workers import Cluster, fit_threads, map_in_processes, map_on_cluster

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One fit for a worker: a seed and a peak learning rate. A search `trial` stops after
    training and keeps its best weights; a job with `trained` (a trial's summary) only restores
    those weights and predicts."""

    seed: int
    lr: float
    trial: bool = False
    trained: dict | None = None


def run_jobs(plan: FitPlan, jobs: list[Job], workers: int, desc: str,
             cluster: Cluster | None = None) -> list[dict]:
    """The jobs' summaries, in order: in this process, side by side in `workers` worker
    processes, or as tasks on the Dask cluster `cluster` (each on the threads a local worker
    would have: the same bits)."""
    if cluster:
        return map_on_cluster(fit_and_predict, plan, [(job,) for job in jobs], cluster, fit_threads(workers),
                              desc)
    if workers == 1:
        return [fit_and_predict(plan, job) for job in bar(jobs, desc, len(jobs), "fit")]
    return map_in_processes(fit_and_predict, plan, [(job,) for job in jobs], workers, desc)


def fit(spec: FitSpec, bert: BertConfig, cfg: FinetuneConfig, weights: Path | None,
        train: list[Encoded], valid: list[Encoded], valid_gold: pa.Table, work: Path):
    """Train one fit with early stopping, from the encoder in `weights` (None: random weights);
    return the model at its best validation pass, the validation history, the steps and the
    file of the best weights (a Lightning checkpoint)."""
    import lightning as L
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    L.seed_everything(spec.seed, workers=True, verbose=False)
    data = Batches(train, spec.kind, cfg.batch_size, spec.seed)
    steps = len(data)
    # A task of a few dozen rows takes epochs enough for finetune.min_steps: 4 steps learn nothing.
    spec = replace(spec, epochs=max(spec.epochs, math.ceil(cfg.min_steps / max(steps, 1))))
    module = FinetuneModule(spec, bert, cfg, weights, valid, valid_gold, steps)
    # Validation a few times per epoch (not on a partial last interval): early stopping and
    # the best weights see the model as it improves, not only at epoch ends.
    interval = max(1, steps // cfg.evals_per_epoch)
    best = ModelCheckpoint(dirpath=work, monitor="val/metric", mode="max", save_top_k=1,
                           save_weights_only=True, filename="best")
    trainer = L.Trainer(
        accelerator="auto", devices=1, precision=resolve_precision(cfg.precision), max_epochs=spec.epochs,
        min_steps=cfg.min_steps, val_check_interval=interval, num_sanity_val_steps=0, limit_val_batches=1,
        gradient_clip_val=cfg.grad_clip or None, deterministic=cfg.deterministic, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[best, EarlyStopping("val/metric", mode="max", patience=spec.patience)],
    )
    trainer.fit(module, train_dataloaders=DataLoader(data, batch_size=None),
                val_dataloaders=DataLoader(Batches(valid[:1], spec.kind, 1, None), batch_size=None))
    state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
    module.load_state_dict(state)
    return module.model.cpu().eval(), module.history, trainer.global_step, Path(best.best_model_path)


def restore(spec: FitSpec, bert: BertConfig, cfg: FinetuneConfig, path: Path) -> torch.nn.Module:
    """A task model with the best weights `fit` kept in `path` (its module's `model.*` keys)."""
    model = task_model(bert, spec.kind, spec.space, cfg.crf, spec.max_span_words)
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    return model.eval()


def fit_spec(plan: FitPlan, job: Job) -> FitSpec:
    """The settings of one fit: the task's, the start's, the job's seed and rate."""
    task, start = plan.task, plan.start
    return FitSpec(kind=task.kind, space=label_space(task.kind, plan.labels, plan.scheme), init=start.init,
                   seed=job.seed, epochs=task.epochs, lr=job.lr, max_span_words=task.max_span_words,
                   span_decoding=task.span_decoding, tag_decoding=task.tag_decoding, scheme=plan.scheme,
                   patience=task.patience, distill=plan.distill)


def fit_and_predict(plan: FitPlan, job: Job) -> dict:
    """One fit: train (or restore a search trial's best weights), predict the test split, write
    `fits/<init>-s<seed>.{parquet,json}`; the first seed is also exported as the task model.
    A search trial returns after training, its best weights kept in `work/`."""
    task, cfg, origin = plan.task, plan.cfg, plan.start
    spec = fit_spec(plan, job)
    name = f"{origin.init}-s{job.seed}"
    start = time.perf_counter()
    if job.trained is None:
        work = plan.out / "work" / (f"{name}-lr{job.lr:g}" if job.trial else name)
        model, history, steps, kept = fit(spec, origin.bert, cfg, origin.weights, origin.encoded["train"],
                                          origin.encoded["valid"], plan.valid_gold, work)
        spent = 0.0
    else:
        t = job.trained
        model, history, steps = restore(spec, origin.bert, cfg, Path(t["kept"])), t["history"], t["steps"]
        spent = t["minutes"]
    best = max((h["val_metric"] for h in history), default=float("nan"))
    if job.trial:
        log.info("lr search %s %s at %g: best validation %.4f in %d steps", plan.name, name,
                 job.lr, best, steps)
        return {"init": origin.init, "seed": job.seed, "lr": job.lr, "steps": steps, "best_val_metric": best,
                "history": history, "kept": str(kept), "minutes": (time.perf_counter() - start) / 60}
    threshold, batch = None, cfg.batch_size * 2  # prediction keeps no gradients: twice the rows
    if task.kind == "span" and cfg.span_threshold:
        threshold = calibrate_threshold(model, spec, origin.encoded["valid"], plan.valid_gold, batch)
    test = predict(model, task.kind, origin.encoded["test"], spec.space, batch, task.span_decoding, threshold,
                   task.tag_decoding)
    pq.write_table(predictions_table(task.kind, test), plan.out / "fits" / f"{name}.parquet")
    summary = {"init": origin.init, "seed": job.seed, "lr": job.lr, "steps": steps, "best_val_metric": best,
               "threshold": threshold, "history": history}
    write_json(plan.out / "fits" / f"{name}.json", summary)  # a DVC output: no wall time in it
    summary["minutes"] = spent + (time.perf_counter() - start) / 60
    summary.update(machine=cpu_facts(), host=socket.gethostname())  # where it ran (on a cluster: a worker)
    log.info("finetune %s %s: best validation %.4f in %d steps, %.1f min", plan.name, name, best,
             steps, summary["minutes"])
    if job.seed == plan.first_seed:
        export_fit(model, plan, spec, name, test, threshold)
    return summary


def calibrate_threshold(model, spec: FitSpec, valid: list[Encoded], gold: pa.Table, batch_size: int) -> float:
    """The span score threshold with the best validation F1 (a grid over (0, 1))."""
    grid = [round(t, 2) for t in np.arange(0.1, 0.95, 0.05)]
    scores = {t: score(spec.kind, spec.space, predict(model, spec.kind, valid, spec.space, batch_size,
                                                      spec.span_decoding, t), gold, spec.scheme)
              for t in grid}
    return max(scores, key=scores.get)
