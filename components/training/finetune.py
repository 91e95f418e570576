"""Stages `finetune@task-start` and `distill@task`: every fit of one start of a task, one per
seed of `finetune.seeds`. A start is what the fits begin from: the pretrained encoder, random
weights (scratch), an imported checkpoint, the task-adapted encoder, or for the distilled
student the teacher's soft targets on the transfer set.

The start's rates are the task's `lr`: one rate, or a list searched on the first seed, whose
every rate trains a trial; the rate with the best validation metric trains the other seeds, and
the winning trial is the start's first fit (no test prediction is made for a losing trial).
Each fit writes its test predictions to `fits/` (training/fits.py), which `evaluate@task`
scores, and the first seed's fit is the start's task model (`model/`). `probe_fits` trains the
same fits on a sample, scored on validation only, for the transfer probe (training/probe.py).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from components.core.config import DistillConfig, FinetuneConfig, TaskConfig
from components.core.errors import ConfigError, DataError
from components.core.io import atomic_dir, write_json
from components.data.tasks.folder import read_meta, read_split
from components.data.transfer_set import read_transfer
from components.model.config import BertConfig, shape_of
from components.model.folders import load_tokenizer, read_weights
from components.model.inputs import Encoded, encode
from components.model.metadata import read_checkpoint_info, read_encoder_info
from components.model.soft_targets import attach_targets
from components.training.fits import Job, run_jobs
from components.training.plan import FitPlan, Start
from components.training.precision import record as precision_record
from components.training.workers import Cluster, worker_count

log = logging.getLogger(__name__)
STARTS = ("pretrained", "scratch", "checkpoint", "adapted")  # the starts of stage finetune@task-start


def finetune_start(name: str, task: TaskConfig, cfg: FinetuneConfig, *, init: str, task_dir: Path,
                   encoder_dir: Path, out_dir: Path, weights_dir: Path | None = None,
                   cluster: Cluster | None = None) -> dict:
    """Every fit of start `init` of a task into `out_dir`: from the encoder in `encoder_dir`
    (pretrained), random weights of its shape (scratch), or the weights in `weights_dir` (an
    imported checkpoint of the encoder's shape, or the task-adapted encoder), all with the
    encoder's tokenizer. `cluster`: the Dask cluster to train the fits on (None: here)."""
    if init not in STARTS:
        raise ConfigError(f"finetune: {init!r} is not a start of this stage ({', '.join(STARTS)})")
    meta, encoder, tokenizer = open_start(name, task, task_dir, encoder_dir)
    if init == "checkpoint":
        _check_same_shape(weights_dir, encoder.config, encoder_dir)
    if init == "adapted" and not (weights_dir and (Path(weights_dir) / "model.safetensors").exists()):
        raise DataError(f"finetune.init has adapted, but {weights_dir} holds no adapted encoder; "
                        f"run the adapt stage of this task first")
    splits = {s: read_split(task_dir, s) for s in ("train", "valid", "test")}
    weights = {"pretrained": Path(encoder_dir), "scratch": None}.get(init, weights_dir)
    start = encoded_start(init, weights, encoder_dir, encoder.config, tokenizer, splits, task, cfg, meta)
    stats = fit_start(name, task, cfg, start, meta, splits, task.lr, cfg.seeds, out_dir, cluster=cluster)
    # What the encoder's pretraining reached: the transfer table flags a run cut short by a guard.
    return {**stats, "encoder": {k: encoder.stats[k] for k in ("steps", "max_steps", "stopped_by")
                                 if k in encoder.stats}}


def distill_student(name: str, task: TaskConfig, cfg: FinetuneConfig, distill: DistillConfig, *,
                    task_dir: Path, encoder_dir: Path, transfer_dir: Path, out_dir: Path,
                    student_dir: Path | None = None, cluster: Cluster | None = None) -> dict:
    """Every fit of the `distilled` start: the student trained on the transfer set in
    `transfer_dir` (the teacher's soft targets), with distill's temperature and mix. The student
    is the pretrained encoder, or the cut of the teacher's checkpoint in `student_dir`
    (training/student.py), which has its own tokenizer and trains at the teacher's rates."""
    meta, encoder, tokenizer = open_start(name, task, task_dir, encoder_dir)
    splits = {s: read_split(task_dir, s) for s in ("train", "valid", "test")}
    student_encoder, rates = Path(encoder_dir), task.lr
    if student_dir is not None:
        _, encoder, tokenizer = open_start(name, task, task_dir, student_dir)
        student_encoder, rates = Path(student_dir), task.teacher_lr
    held_out = {s: splits[s] for s in ("valid", "test")}  # it trains on the transfer set
    start = encoded_start("distilled", student_encoder, student_encoder, encoder.config, tokenizer, held_out,
                          task, cfg, meta)
    start.encoded["train"] = transfer_examples(transfer_dir, name, task, cfg, tokenizer, meta, start.max_len)
    stats = fit_start(name, task, cfg, start, meta, splits, rates, cfg.seeds, out_dir,
                      soft=(distill.temperature, distill.alpha), cluster=cluster)
    return {**stats, "transfer_examples": len(start.encoded["train"])}


def fit_start(name: str, task: TaskConfig, cfg: FinetuneConfig, start: Start, meta: dict,
              splits: dict[str, pa.Table], rates: list[float], seeds: list[int], out_dir: Path,
              soft: tuple[float, float] | None = None, cluster: Cluster | None = None) -> dict:
    """The fits of one start, a seed each, at the rate its search chose (or its one rate), into
    `out_dir`: `fits/`, the search's record, and the first seed's task model in `model/`; on
    the Dask cluster `cluster` if one is given."""
    init = start.init
    stats: dict = {"kind": task.kind, "labels": len(meta["labels"]), "max_seq_len": start.max_len,
                   "epochs": task.epochs, **precision_record(cfg.precision),
                   **({"scheme": meta["scheme"]} if "scheme" in meta else {}),
                   "train_examples": splits["train"].num_rows, "fits": {},
                   **({"train_windows": len(start.encoded["train"])}
                      if task.long_text == "chunks" and soft is None else {})}
    with atomic_dir(out_dir) as tmp:
        (tmp / "fits").mkdir()
        plan = FitPlan(name=name, task=task, cfg=cfg, labels=meta["labels"], scheme=meta.get("scheme", ""),
                       start=start, out=tmp, valid_gold=splits["valid"], test_gold=splits["test"],
                       first_seed=seeds[0], distill=soft)
        workers = worker_count(cfg.workers, max(len(rates), len(seeds)))
        # Wall minutes, the worker count and the hosts describe this execution, not the models:
        # MLflow only.
        this_run: dict = {"workers": workers, "cluster": cluster.address if cluster else "local"}
        stats["machine"] = {}  # what decides the fits' last bits: the CPU and threads they ran on
        lr, winner, search = search_rate(plan, rates, workers, cluster)
        if search:
            minutes = search.pop("minutes")
            stats["search"] = search
            write_json(tmp / "fits" / f"{init}-search.json", search)
            this_run.update({f"search.{rate}.minutes": m for rate, m in minutes.items()})
        jobs = [Job(seed, lr, trained=winner if seed == seeds[0] else None) for seed in seeds]
        summaries = run_jobs(plan, jobs, workers, f"finetune {name} {init}", cluster)
        for summary in summaries:
            fit = f"{init}-s{summary['seed']}"
            stats["fits"][fit] = {k: summary[k] for k in ("steps", "best_val_metric", "lr")}
            this_run[f"{fit}.minutes"] = summary["minutes"]
        machines = list({json.dumps(s["machine"], sort_keys=True): s["machine"] for s in summaries}.values())
        stats["machine"] = machines[0]
        if len(machines) > 1:  # a cluster of several CPU types: the fits' bits are each their own
            stats["machines"] = machines
        this_run["hosts"] = " ".join(sorted({s["host"] for s in summaries}))
        stats["this_run"] = this_run
        shutil.rmtree(tmp / "work", ignore_errors=True)
    return stats


def search_rate(plan: FitPlan, rates: list[float], workers: int,
                cluster: Cluster | None = None) -> tuple[float, dict | None, dict]:
    """The rate the start's fits train at, the winning trial (None without a search: one rate)
    and the search's record (`lr`, `trials` by rate, and each trial's minutes)."""
    if len(rates) == 1:
        return rates[0], None, {}
    seed = plan.first_seed
    trials = run_jobs(plan, [Job(seed, lr, trial=True) for lr in rates], workers,
                      f"lr search {plan.name} {plan.start.init}", cluster)
    winner = max(trials, key=lambda t: t["best_val_metric"])  # the first on a tie
    record = {"lr": winner["lr"], "trials": {f"{t['lr']:g}": {k: t[k] for k in ("steps", "best_val_metric")}
                                             for t in trials},
              "minutes": {f"{t['lr']:g}": t["minutes"] for t in trials}}
    return winner["lr"], winner, record


def probe_fits(name: str, task: TaskConfig, cfg: FinetuneConfig, task_dir: Path, encoder_dir: Path,
               work_dir: Path, train_examples: int = 0, seed: int = 0) -> list[dict]:
    """Validation only, to compare encoders: a fit per seed of `cfg.seeds` from the encoder in
    `encoder_dir` at the task's first rate, on at most `train_examples` training examples (a
    seeded sample; 0: all). The test split is not read and nothing is exported; each summary
    has the fit's best validation metric, steps and minutes."""
    meta, encoder, tokenizer = open_start(name, task, task_dir, encoder_dir)
    splits = {s: read_split(task_dir, s) for s in ("train", "valid")}
    if 0 < train_examples < splits["train"].num_rows:
        rows = np.sort(np.random.default_rng(seed).permutation(splits["train"].num_rows)[:train_examples])
        splits["train"] = splits["train"].take(rows)
    start = encoded_start("pretrained", Path(encoder_dir), encoder_dir, encoder.config, tokenizer, splits,
                          task, cfg, meta)
    plan = FitPlan(name=name, task=task, cfg=cfg, labels=meta["labels"], scheme=meta.get("scheme", ""),
                   start=start, out=Path(work_dir), valid_gold=splits["valid"], test_gold=None,
                   first_seed=cfg.seeds[0])
    jobs = [Job(s, task.lr[0], trial=True) for s in cfg.seeds]
    try:
        summaries = run_jobs(plan, jobs, worker_count(cfg.workers, len(jobs)), f"probe {name}")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)  # the trials' weights: nothing to keep
    return [{k: t[k] for k in ("seed", "lr", "steps", "best_val_metric", "minutes")} for t in summaries]


def open_start(name: str, task: TaskConfig, task_dir: Path, encoder_dir: Path):
    """The task's meta.json, the encoder's record and its tokenizer, checked against each other."""
    if not (Path(encoder_dir) / "bertflow.json").exists():
        raise DataError(f"{encoder_dir}: no pretrained encoder; run the pretrain stage first")
    meta = read_meta(task_dir)
    if meta["kind"] != task.kind:
        raise DataError(f"{task_dir}: holds {meta['kind']} data, but task {name} is {task.kind}")
    encoder = read_encoder_info(encoder_dir)
    tokenizer = load_tokenizer(encoder_dir, encoder.config)
    read_weights(Path(encoder_dir) / "model.safetensors")  # fail now, not in every fit's process
    return meta, encoder, tokenizer


def encoded_start(init: str, weights: Path | None, tokenizer_dir: Path, bert: BertConfig, tokenizer,
                  splits: dict[str, pa.Table], task: TaskConfig, cfg: FinetuneConfig, meta: dict) -> Start:
    """Start `init` from `weights` (None: random): each split's examples encoded once by the
    tokenizer of `tokenizer_dir`, for every fit."""
    max_len = min(task.max_seq_len, bert.max_position)
    encoded = {s: encode(t, task.kind, tokenizer, meta["labels"], max_len, task.long_text, cfg.label_subwords,
                         task.max_span_words, meta.get("scheme", ""), task.chunk_overlap)
               for s, t in splits.items()}
    return Start(init=init, weights=weights, bert=bert, tokenizer_dir=Path(tokenizer_dir), encoded=encoded,
                 max_len=max_len)


def transfer_examples(transfer_dir: Path, name: str, task: TaskConfig, cfg: FinetuneConfig, tokenizer,
                      meta: dict, max_len: int) -> list[Encoded]:
    """The `distilled` start's training examples: the transfer set (data.transfer_set) encoded
    for the student, each with its teacher's soft targets."""
    table, targets = read_transfer(transfer_dir, name, task.kind, meta)
    examples = encode(table, task.kind, tokenizer, meta["labels"], max_len, task.long_text,
                      cfg.label_subwords, task.max_span_words, meta.get("scheme", ""), task.chunk_overlap)
    attach_targets(examples, task.kind, targets, table["gold"].to_pylist(), task.max_span_words)
    return examples


def _check_same_shape(checkpoint_dir: Path | None, bert: BertConfig, encoder_dir: Path) -> None:
    """The `checkpoint` start shares the encoder's tokenizer and shape: it must be its start."""
    info = read_checkpoint_info(checkpoint_dir) if checkpoint_dir is not None else None
    if info is None or info.config is None:
        raise ConfigError("finetune.init has checkpoint, but no checkpoint was imported "
                          "(pretrain.init_from is empty)")
    ours, theirs = shape_of(bert), shape_of(info.config)
    if ours != theirs:
        raise DataError(f"finetune.init checkpoint: {checkpoint_dir} ({theirs}) is not the shape "
                        f"of the encoder {encoder_dir} ({ours}); rerun the pretrain stage")
