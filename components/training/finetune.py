"""Stage `finetune@task`: every fit of a task, from each init of `finetune.init` (the pretrained
encoder, random weights, an imported checkpoint, the task-adapted encoder) and each seed.

Examples are encoded once (the tokenizer of the encoder), batched by length so that short
sentences are not padded to the longest of the split, and kept in memory (tasks are small).
Validation runs a few times per epoch; early stopping and the best weights follow the task's
primary metric (accuracy; entity F1 for BIO token and span tasks; word accuracy for plain
tags). With several learning rates (a list as the task's `lr`) each init first trains its
first seed at every rate; the rate with the best validation metric trains the other seeds, and
the winning trial is that init's first fit (no test prediction is made for a losing trial). Each
fit writes its test predictions to `fits/`; `evaluate@task` scores them. The first init's first
seed is exported as the task's model (model.metadata.TaskModelInfo). `probe_fits` trains the
same fits on a sample, scored on validation only, for the transfer probe (training/probe.py).

Each fit records its init's key: the digest of everything that decides it but the seed (the
code, the start's weights and tokenizer, the task data, the settings that reach a fit). The
fits of an init (but the exported first) whose every seed lies in another run's task folder
under the same key are taken from there instead of trained: a preset fits the default run's
starts once (`reuse_from`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader

from components.core.config import DistillConfig, FinetuneConfig, TaskConfig
from components.core.digests import digest
from components.core.errors import ConfigError, DataError
from components.core.imports import ROOT, code_files
from components.core.io import atomic_dir, read_json, write_json
from components.core.machine import cpu_facts
from components.core.progress import bar
from components.data.tasks.folder import read_meta, read_split
from components.data.transfer_set import read_transfer
from components.evaluation.metrics import primary_metric
from components.model.build import task_model
from components.model.config import BertConfig, shape_of
from components.model.decoding import predict, predictions_table
from components.model.folders import load_tokenizer, read_weights, write_task_model
from components.model.inputs import Encoded, encode, label_space
from components.model.metadata import TaskModelInfo, read_checkpoint_info, read_encoder_info
from components.model.onnx_model import ONNX_DIR, write_onnx
from components.model.soft_targets import attach_targets
from components.training.batching import Batches
from components.training.common import resolve_precision
from components.training.finetune_module import FinetuneModule, FitSpec, score
from components.training.workers import map_in_processes, threads_per_worker, worker_count

log = logging.getLogger(__name__)


@dataclass
class Start:
    """What the fits of one init start from. Inits of one encoder share its tokenizer and
    encoded examples; a student cut from the teacher has its own."""

    weights: Path | None  # the encoder folder whose weights it loads; None: random weights
    bert: BertConfig
    tokenizer_dir: Path  # exported with the task model
    encoded: dict[str, list[Encoded]]  # train, valid, test; the `distilled` start's transfer set
    max_len: int  # tokens per example, as resolved for this task and encoder


@dataclass
class TaskFits:
    """Everything the fits of one task share: shipped once to each worker process."""

    name: str
    task: TaskConfig
    cfg: FinetuneConfig
    labels: list[str]
    scheme: str  # token and span tasks: bio or plain (meta.json's); "" for text tasks
    starts: dict[str, Start]  # by init
    out: Path  # the stage's temporary output folder
    valid_gold: pa.Table
    test_gold: pa.Table | None  # the ONNX int8 check's (finetune.onnx); None in the probe
    epochs: int  # the task's
    distill: tuple[float, float] | None = None  # the `distilled` start's (temperature, alpha)
    keys: dict[str, str] | None = None  # by init (fit_key); None in the probe


@dataclass(frozen=True)
class Job:
    """One fit for a worker: an init, a seed and a peak learning rate. A search `trial` stops
    after training and keeps its best weights; a job with `trained` (a trial's summary) only
    restores those weights and predicts."""

    init: str
    seed: int
    lr: float
    trial: bool = False
    trained: dict | None = None


def finetune_task(name: str, task: TaskConfig, cfg: FinetuneConfig, task_dir: Path,
                  encoder_dir: Path, out_dir: Path, checkpoint_dir: Path | None = None,
                  adapted_dir: Path | None = None, distill: DistillConfig | None = None,
                  transfer_dir: Path | None = None, student_dir: Path | None = None,
                  reuse_from: list[Path] = ()) -> dict:
    """Every fit of one task (each init of `cfg.init`, each seed): test predictions and
    validation curves per fit, and the exported first fit of the first init. The `distilled`
    start trains its student on the transfer set in `transfer_dir`, with `distill`'s temperature
    and mix: the pretrained encoder, or the cut of the teacher's checkpoint in `student_dir`
    (training/student.py), which has its own tokenizer and trains at the teacher's rates.
    An init's fits found under its key in a task folder of `reuse_from` are copied, not trained."""
    meta, encoder, tokenizer = _open(name, task, task_dir, encoder_dir)
    if "checkpoint" in cfg.init:
        _check_same_shape(checkpoint_dir, encoder.config, encoder_dir)
    if "adapted" in cfg.init and not (adapted_dir and (Path(adapted_dir) / "model.safetensors").exists()):
        raise DataError(f"finetune.init has adapted, but {adapted_dir} holds no adapted encoder; "
                        f"run the adapt stage of this task first")
    splits = {s: read_split(task_dir, s) for s in ("train", "valid", "test")}
    ours = _start(encoder_dir, encoder.config, tokenizer, splits, task, cfg, meta)
    starts = {"pretrained": ours, "scratch": replace(ours, weights=None),
              "checkpoint": replace(ours, weights=checkpoint_dir),
              "adapted": replace(ours, weights=adapted_dir)}
    rates = {init: task.lr for init in cfg.init}
    soft = None
    if "distilled" in cfg.init:
        student, student_tokenizer = ours, tokenizer
        if student_dir is not None:
            _, cut, student_tokenizer = _open(name, task, task_dir, student_dir)
            held_out = {s: splits[s] for s in ("valid", "test")}  # it trains on the transfer set
            student = _start(student_dir, cut.config, student_tokenizer, held_out, task, cfg, meta)
            rates["distilled"] = task.teacher_lr
        student.encoded["transfer"] = transfer_examples(transfer_dir, name, task, cfg, student_tokenizer,
                                                        meta, student.max_len)
        starts["distilled"] = student
        soft = (distill.temperature, distill.alpha)
    # What the encoder's pretraining reached: the transfer table flags a run cut short by a guard.
    stats: dict = {"kind": task.kind, "labels": len(meta["labels"]), "max_seq_len": ours.max_len,
                   "epochs": task.epochs, "precision": resolve_precision(cfg.precision),
                   **({"scheme": meta["scheme"]} if "scheme" in meta else {}),
                   "train_examples": splits["train"].num_rows, "fits": {},
                   **({"train_windows": len(ours.encoded["train"])} if task.long_text == "chunks" else {}),
                   **({"transfer_examples": len(starts["distilled"].encoded["transfer"])} if soft else {}),
                   "encoder": {k: encoder.stats[k] for k in ("steps", "max_steps", "stopped_by")
                               if k in encoder.stats}}
    keys = {init: fit_key(init, starts[init], rates[init], task, cfg, task.epochs, task_dir, transfer_dir,
                          soft) for init in cfg.init}
    with atomic_dir(out_dir) as tmp:
        (tmp / "fits").mkdir()
        taken = _take_fits(keys, cfg, reuse_from, tmp / "fits")
        shared = TaskFits(name, task, cfg, meta["labels"], meta.get("scheme", ""),
                          {init: starts[init] for init in cfg.init}, tmp, splits["valid"], splits["test"],
                          task.epochs, soft, keys)
        most = max(len(r) for r in rates.values())
        workers = worker_count(cfg.workers, len(cfg.init) * max(most, len(cfg.seeds)))
        # Wall minutes and the worker count describe this execution, not the models: MLflow only.
        this_run: dict = {"workers": workers}
        # What decides the fits' last bits: the threads each fit ran on (a worker's share, or
        # this process's own when the fits run here).
        threads = threads_per_worker(workers) if workers > 1 else torch.get_num_threads()
        stats["machine"] = {**cpu_facts(), "threads": threads}
        chosen = {init: rates[init][0] for init in cfg.init}
        winners: dict[str, dict] = {}
        searched = [init for init in cfg.init if len(rates[init]) > 1 and init not in taken]
        if searched:
            trials = _run(shared, [Job(init, cfg.seeds[0], lr, trial=True)
                                   for init in searched for lr in rates[init]], workers, f"lr search {name}")
            for init in searched:
                mine = [t for t in trials if t["init"] == init]
                winners[init] = max(mine, key=lambda t: t["best_val_metric"])  # the first on a tie
                chosen[init] = winners[init]["lr"]
                stats.setdefault("search", {})[init] = {"lr": chosen[init], "trials": {
                    f"{t['lr']:g}": {k: t[k] for k in ("steps", "best_val_metric")} for t in mine}}
                write_json(tmp / "fits" / f"{init}-search.json", stats["search"][init])  # taken with the fits
                this_run.update({f"search.{init}.{t['lr']:g}.minutes": t["minutes"] for t in mine})
        for init, search in taken.items():
            if search is not None:
                stats.setdefault("search", {})[init] = search
        if taken:
            this_run["taken"] = ",".join(taken)  # MLflow only: the fits are the same either way
        jobs = [Job(init, seed, chosen[init], trained=winners.get(init) if seed == cfg.seeds[0] else None)
                for init in cfg.init if init not in taken for seed in cfg.seeds]
        trained = _run(shared, jobs, workers, f"finetune {name}")
        this_run.update({f"{s['init']}-s{s['seed']}.minutes": s["minutes"] for s in trained})
        given = [read_json(tmp / "fits" / f"{init}-s{seed}.json") for init in taken for seed in cfg.seeds]
        for summary in [*given, *trained]:
            stats["fits"][f"{summary['init']}-s{summary['seed']}"] = {
                k: summary[k] for k in ("steps", "best_val_metric", "lr")}
        stats["this_run"] = this_run
        shutil.rmtree(tmp / "work", ignore_errors=True)
    return stats


# Settings that reach no fit of an init, or reach it only through what its key digests anyway:
# the list of inits, the other tasks, the seeds (each fit's own), the export, the worker count
# (fits in workers are those of one process), and the teacher's settings (its transfer set and
# its rates are in the key).
_NOT_IN_KEY = {"init", "task_defaults", "tasks", "seeds", "onnx", "workers"}
_TASK_NOT_IN_KEY = {"teacher_lr", "transfer_corpus", "transfer_pairs", "pair_link"}


def fit_key(init: str, start: Start, rates: list[float], task: TaskConfig, cfg: FinetuneConfig, epochs: int,
            task_dir: Path, transfer_dir: Path | None, soft: tuple[float, float] | None) -> str:
    """The digest of everything that decides the fits of `init` but the seed (the transfer set
    and the mix only the `distilled` start's)."""
    distilled = init == "distilled"
    facts = {"init": init, "code": _code_digest(), "config": asdict(start.bert), "max_len": start.max_len,
             "weights": digest(start.weights) if start.weights else None,
             "tokenizer": digest(start.tokenizer_dir), "data": digest(Path(task_dir)),
             "transfer": digest(Path(transfer_dir)) if distilled and transfer_dir else None,
             "soft": soft if distilled else None,
             "rates": rates, "epochs": epochs, "precision": resolve_precision(cfg.precision),
             "finetune": cfg.model_dump(mode="json", exclude=_NOT_IN_KEY),
             "task": task.model_dump(mode="json", exclude=_TASK_NOT_IN_KEY)}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


@cache
def _code_digest() -> str:
    """The code a fit runs (this module and what it imports): a fit of other code is never taken
    for this code's, and an edit elsewhere (the teacher's stage, serving) keeps every fit."""
    h = hashlib.sha256()
    for path in code_files([__name__]):
        h.update(f"{path.relative_to(ROOT).as_posix()}\0{digest(path)}\n".encode())
    return h.hexdigest()


def _take_fits(keys: dict[str, str], cfg: FinetuneConfig, reuse_from: list[Path],
               fits: Path) -> dict[str, dict | None]:
    """Copy into `fits` the fits of each init but the first (the exported one) that a folder of
    `reuse_from` holds for every seed under the init's key; by init, its rate search (None
    without one)."""
    taken: dict[str, dict | None] = {}
    for init in cfg.init[1:]:
        for folder in map(Path, reuse_from):
            names = [f"{init}-s{seed}" for seed in cfg.seeds]
            if all(_key_of(folder / "fits" / f"{n}.json") == keys[init] for n in names):
                for n in names:
                    for suffix in (".json", ".parquet"):
                        shutil.copyfile(folder / "fits" / f"{n}{suffix}", fits / f"{n}{suffix}")
                search = folder / "fits" / f"{init}-search.json"
                taken[init] = read_json(search) if search.is_file() else None
                if taken[init] is not None:
                    shutil.copyfile(search, fits / search.name)
                log.info("finetune: the %s fits are %s's (the same key), not trained again", init, folder)
                break
    return taken


def _key_of(fit: Path) -> str | None:
    """The key a fit's record holds (None: no record, or one without a key)."""
    try:
        return read_json(fit).get("key")
    except (FileNotFoundError, ValueError):
        return None


def probe_fits(name: str, task: TaskConfig, cfg: FinetuneConfig, task_dir: Path, encoder_dir: Path,
               work_dir: Path, train_examples: int = 0, seed: int = 0) -> list[dict]:
    """Validation only, to compare encoders: a fit per seed of `cfg.seeds` from the encoder in
    `encoder_dir` at the task's first rate, on at most `train_examples` training examples (a
    seeded sample; 0: all). The test split is not read and nothing is exported; each summary
    has the fit's best validation metric, steps and minutes."""
    meta, encoder, tokenizer = _open(name, task, task_dir, encoder_dir)
    splits = {s: read_split(task_dir, s) for s in ("train", "valid")}
    if 0 < train_examples < splits["train"].num_rows:
        rows = np.sort(np.random.default_rng(seed).permutation(splits["train"].num_rows)[:train_examples])
        splits["train"] = splits["train"].take(rows)
    shared = TaskFits(name, task, cfg, meta["labels"], meta.get("scheme", ""),
                      {"pretrained": _start(encoder_dir, encoder.config, tokenizer, splits, task, cfg, meta)},
                      Path(work_dir), splits["valid"], None, task.epochs)
    jobs = [Job("pretrained", s, task.lr[0], trial=True) for s in cfg.seeds]
    try:
        summaries = _run(shared, jobs, worker_count(cfg.workers, len(jobs)), f"probe {name}")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)  # the trials' weights: nothing to keep
    return [{k: t[k] for k in ("seed", "lr", "steps", "best_val_metric", "minutes")} for t in summaries]


def _open(name: str, task: TaskConfig, task_dir: Path, encoder_dir: Path):
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


def _start(encoder_dir: Path, bert: BertConfig, tokenizer, splits: dict[str, pa.Table], task: TaskConfig,
           cfg: FinetuneConfig, meta: dict) -> Start:
    """The start from the encoder in `encoder_dir`: each split's examples encoded once by its
    tokenizer, for every fit."""
    max_len = min(task.max_seq_len, bert.max_position)
    encoded = {s: encode(t, task.kind, tokenizer, meta["labels"], max_len, task.long_text, cfg.label_subwords,
                         task.max_span_words, meta.get("scheme", ""), task.chunk_overlap)
               for s, t in splits.items()}
    return Start(Path(encoder_dir), bert, Path(encoder_dir), encoded, max_len)


def transfer_examples(transfer_dir: Path | None, name: str, task: TaskConfig, cfg: FinetuneConfig, tokenizer,
                      meta: dict, max_len: int) -> list[Encoded]:
    """The `distilled` start's training examples: the transfer set (data.transfer_set) encoded
    for the student, each with its teacher's soft targets."""
    table, targets = read_transfer(transfer_dir, name, task.kind, meta)
    examples = encode(table, task.kind, tokenizer, meta["labels"], max_len, task.long_text,
                      cfg.label_subwords, task.max_span_words, meta.get("scheme", ""), task.chunk_overlap)
    attach_targets(examples, task.kind, targets, table["gold"].to_pylist(), task.max_span_words)
    return examples


def _run(shared: TaskFits, jobs: list[Job], workers: int, desc: str) -> list[dict]:
    """The jobs' summaries, in order: in this process, or side by side in worker processes."""
    if workers == 1:
        return [fit_and_predict(shared, job) for job in bar(jobs, desc, len(jobs), "fit")]
    return map_in_processes(fit_and_predict, shared, [(job,) for job in jobs], workers, desc)


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


def fit_and_predict(shared: TaskFits, job: Job) -> dict:
    """One fit: train (or restore a search trial's best weights), predict the test split, write
    `fits/<init>-s<seed>.{parquet,json}`; the first init's first seed is also exported as the
    task's model. A search trial returns after training, its best weights kept in `work/`."""
    task, cfg = shared.task, shared.cfg
    space = label_space(task.kind, shared.labels, shared.scheme)
    init, seed = job.init, job.seed
    origin = shared.starts[init]
    encoded = origin.encoded
    name = f"{init}-s{seed}"
    spec = FitSpec(task.kind, space, init, seed, shared.epochs, job.lr, task.max_span_words,
                   task.span_decoding, task.tag_decoding, shared.scheme, task.patience,
                   shared.distill if init == "distilled" else None)
    start = time.perf_counter()
    if job.trained is None:
        work = shared.out / "work" / (f"{name}-lr{job.lr:g}" if job.trial else name)
        train = encoded["transfer" if init == "distilled" else "train"]
        model, history, steps, kept = fit(spec, origin.bert, cfg, origin.weights, train,
                                          encoded["valid"], shared.valid_gold, work)
        spent = 0.0
    else:
        t = job.trained
        model, history, steps = restore(spec, origin.bert, cfg, Path(t["kept"])), t["history"], t["steps"]
        spent = t["minutes"]
    best = max((h["val_metric"] for h in history), default=float("nan"))
    if job.trial:
        log.info("lr search %s %s at %g: best validation %.4f in %d steps", shared.name, name,
                 job.lr, best, steps)
        return {"init": init, "seed": seed, "lr": job.lr, "steps": steps, "best_val_metric": best,
                "history": history, "kept": str(kept),
                "minutes": (time.perf_counter() - start) / 60}
    threshold = None
    if task.kind == "span" and cfg.span_threshold:
        threshold = calibrate_threshold(model, spec, encoded["valid"], shared.valid_gold, cfg.batch_size * 2)
    test = predict(model, task.kind, encoded["test"], space, cfg.batch_size * 2, task.span_decoding,
                   threshold, task.tag_decoding)
    pq.write_table(predictions_table(task.kind, test), shared.out / "fits" / f"{name}.parquet")
    summary = {"init": init, "seed": seed, "lr": job.lr, "steps": steps, "best_val_metric": best,
               "threshold": threshold, "history": history, "key": shared.keys[init]}
    write_json(shared.out / "fits" / f"{name}.json", summary)  # a DVC output: no wall time in it
    summary["minutes"] = spent + (time.perf_counter() - start) / 60
    log.info("finetune %s %s: best validation %.4f in %d steps, %.1f min", shared.name, name, best,
             steps, summary["minutes"])
    if init == cfg.init[0] and seed == cfg.seeds[0]:
        info = TaskModelInfo(config=origin.bert, task=task, fit=name, labels=shared.labels, space=space,
                             max_seq_len=origin.max_len, label_subwords=cfg.label_subwords,
                             crf=getattr(model, "crf", None) is not None, threshold=threshold,
                             scheme=shared.scheme)
        write_task_model(model, info, origin.tokenizer_dir, shared.out / "model")
        if cfg.onnx:
            metric = (primary_metric(task.kind, shared.scheme),
                      lambda found: score(task.kind, space, found, shared.test_gold, shared.scheme))
            check = write_onnx(model, task.kind, space, encoded["test"], test, metric, origin.max_len,
                               shared.out / "model" / ONNX_DIR, cfg.batch_size * 2,
                               span_decoding=task.span_decoding, threshold=threshold,
                               tag_decoding=task.tag_decoding)
            log.info("finetune %s: int8 answers as fp32 on %.2f%% of the test split, %s %.4f vs %.4f%s",
                     shared.name, 100 * check["agreement"], check["metric"], check["int8"], check["fp32"],
                     f"; int8 refused: {check['refused']}" if check["refused"] else "")
    return summary


def calibrate_threshold(model, spec: FitSpec, valid: list[Encoded], gold: pa.Table, batch_size: int) -> float:
    """The span score threshold with the best validation F1 (a grid over (0, 1))."""
    grid = [round(t, 2) for t in np.arange(0.1, 0.95, 0.05)]
    scores = {t: score(spec.kind, spec.space, predict(model, spec.kind, valid, spec.space, batch_size,
                                                      spec.span_decoding, t), gold, spec.scheme)
              for t in grid}
    return max(scores, key=scores.get)
