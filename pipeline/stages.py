"""The stages: what each reads from params.yaml and which component function it calls.

`run_stage` is what both `bertflow stage NAME` (called by dvc.yaml) and the Prefect flow run, so
the two paths share every line that matters. Stage order here is the DAG order of dvc.yaml.
Each entry imports the component functions it calls inside its body: pipeline.deps reads those
imports to write the stage's code deps into dvc.yaml.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.core.config import Params
from components.core.errors import BertflowError
from components.core.params import load_params

if TYPE_CHECKING:
    from components.core.tracking import MlflowRun

log = logging.getLogger(__name__)
PARENT_RUN_ENV = "BERTFLOW_PARENT_RUN_ID"  # set by the flow for stages it runs as a subprocess
RUN_KEY_ENV = "BERTFLOW_RUN_KEY"  # and the key that makes its retries reopen one MLflow run


@dataclass(frozen=True)
class Stage:
    """One pipeline stage."""

    name: str
    call: Callable[[Params, Path, MlflowRun | None, str], dict]
    """Calls the component function with paths resolved against the project root, the stage's
    MLflow run (None on the non-zero ranks of a distributed run) and the task ('' if none)."""
    params: tuple[str, ...]
    """params.yaml keys it reads: exactly dvc.yaml's `params:` list (a test keeps them equal);
    in a per-task stage, `{task}` stands for the task's name."""
    replaces: Callable[[Params, str], tuple[str, str]] | None = None
    """The folder it replaces whole, as (the params key that names it, the path), for the check
    that it is bertflow's before anything runs (components.core.guard)."""
    artifacts: Callable[[Params, Path, str], list[Path]] = field(default=lambda p, root, task: [])
    """Small outputs to attach to the MLflow run besides the stats."""
    per_task: bool = False
    """One stage per task of finetune.tasks (a dvc.yaml `foreach`), named `stage@task`."""
    own_process: bool = False
    """The flow runs it as `bertflow stage NAME`: Lightning's DDP launcher starts the other
    ranks by re-running the current command, which must be the stage, not the whole flow."""


def _ingest(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.data.ingest import ingest

    return ingest(p.ingest, root, root / p.paths.packages, root / p.paths.raw)


def _clean(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.data.clean import clean

    return clean(p.clean, p.executor, root / p.paths.raw, root / p.paths.clean)


def _checkpoint(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.model.checkpoint import import_checkpoint

    return import_checkpoint(p.pretrain.init_from, root, root / p.paths.packages,
                             root / p.paths.checkpoint)


def _tokenizer(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    if p.pretrain.init_from:  # the checkpoint's embeddings index its own vocabulary
        from components.model.checkpoint_tokenizer import adopt_tokenizer

        return adopt_tokenizer(p.pretrain.init_from, root / p.paths.checkpoint, root / p.paths.clean,
                               root / p.paths.tokenizer)
    from components.data.tokenizer import train_tokenizer

    return train_tokenizer(p.tokenizer, root / p.paths.clean, root / p.paths.tokenizer,
                           max_len=p.model.max_position)


def _pairs(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.data.pairs import make_pairs

    return make_pairs(p.pairs, p.executor, root / p.paths.clean, root / p.paths.tokenizer,
                      root / p.paths.pairs)


def _pretrain(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.evaluation.plots import write_pretrain_curve
    from components.training.pretrain import pretrain

    stats = pretrain(model=p.model, cfg=p.pretrain, pairs_dir=root / p.paths.pairs,
                     tokenizer_dir=root / p.paths.tokenizer, out_dir=root / p.paths.models / "encoder",
                     work_dir=root / p.paths.models / "pretrain-snapshots",
                     checkpoint_dir=root / p.paths.checkpoint if p.pretrain.init_from else None,
                     mlflow_run=(run.uri, run.run_id) if run else None)
    if run is None:  # a non-zero rank: rank 0 writes and records everything
        return stats
    history = stats.pop("history")
    write_pretrain_curve(history, root / p.paths.metrics / "pretrain_curve.csv",
                         root / p.paths.metrics / "pretrain_curve.png")
    return stats  # the encoder is registered after the run (pipeline.publish), once per content


def _task_data(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.data.tasks.prepare import prepare_task

    return prepare_task(task, p.finetune.tasks[task], root, root / p.paths.packages,
                        root / p.paths.tasks / task)


def _adapt(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.training.adapt import adapt_task

    stats = adapt_task(p.adapt, "adapted" in p.finetune.init, p.finetune.tasks[task], p.model, p.pretrain,
                       root / p.paths.tasks / task, root / p.paths.models / "encoder",
                       root / p.paths.models / "adapted" / task,
                       root / p.paths.models / "adapt-snapshots" / task,
                       mlflow_run=(run.uri, run.run_id) if run else None)
    stats.pop("history", None)  # in the adapted encoder's bertflow.json and the MLflow curves
    return stats


def _teacher(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.training.teacher import fit_teacher

    out = root / p.paths.models / "teachers" / task
    stats = fit_teacher(task, p.finetune.tasks[task], p.finetune, p.distill, "distilled" in p.finetune.init,
                        root, root / p.paths.packages, root / p.paths.tasks / task, out)
    if run is not None and stats["teacher"]:
        run.log_artifact(out / "model", "model")
    return stats


def _transfer_set(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.training.transfer_set import build_transfer

    return build_transfer(task, p.finetune.tasks[task], p.finetune, p.distill, "distilled" in p.finetune.init,
                          root / p.paths.tasks / task, root / p.paths.models / "encoder",
                          root / p.paths.models / "teachers" / task,
                          root / p.paths.models / "transfer-set" / task, root / p.paths.clean)


def _finetune(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.training.finetune import finetune_task
    from components.training.student import student_encoder

    out = root / p.paths.models / "tasks" / task
    with student_encoder(p.distill, "distilled" in p.finetune.init, root, root / p.paths.packages) as student:
        stats = finetune_task(task, p.finetune.tasks[task], p.finetune, root / p.paths.tasks / task,
                              root / p.paths.models / "encoder", out, root / p.paths.checkpoint,
                              root / p.paths.models / "adapted" / task, p.distill,
                              root / p.paths.models / "transfer-set" / task, student,
                              reuse_from=_fits_to_take(p, root, task))
    if run is not None:
        run.log_artifact(out / "model", "model")
        _log_search(p, root, run, task, stats)
    return stats


def _fits_to_take(p: Params, root: Path, task: str) -> list[Path]:
    """Where the task's finetune stage looks for fits under their keys (training/finetune.py):
    its own last output, so a changed start (a new student) is the only one trained again; and in
    a preset (another params file than the project's params.yaml), the default run's too."""
    default = root / "params.yaml"
    others = [load_params(default).paths.models] if default.is_file() else []
    return [root / m / "tasks" / task for m in dict.fromkeys([p.paths.models, *others])]


def _log_search(p: Params, root: Path, run: MlflowRun, task: str, stats: dict) -> None:
    """Each trial of the learning-rate search as a child run of the stage's MLflow run (a
    retry of the stage reopens the same children); an init whose fits were taken from another
    run has its trials there."""
    from components.core.tracking import mlflow_run

    taken = stats["this_run"].get("taken", "").split(",")
    for init, search in stats.get("search", {}).items():
        if init in taken:
            continue
        for lr, trial in search["trials"].items():
            with mlflow_run(p.tracking, root, f"finetune@{task} {init} lr={lr}", parent_run_id=run.run_id,
                            key=f"{run.run_id}/{init}/{lr}") as child:
                child.log_params({"init": init, "seed": p.finetune.seeds[0], "lr": lr})
                child.log_metrics({**trial, "minutes": stats["this_run"][f"search.{init}.{lr}.minutes"]})
                child.set_tags({"bertflow.lr_chosen": lr == f"{search['lr']:g}"})


def _evaluate(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.evaluation.evaluate import evaluate_task

    return evaluate_task(task, p.finetune.tasks[task], p.evaluate, root / p.paths.tasks / task,
                         root / p.paths.models / "tasks" / task, root / p.paths.metrics / "tasks" / task)


def _transfer(p: Params, root: Path, run: MlflowRun | None, task: str) -> dict:
    from components.evaluation.transfer import transfer_report

    metrics = root / p.paths.metrics
    return transfer_report(list(p.finetune.tasks), metrics / "tasks", metrics / "transfer.md",
                           metrics / "transfer.json", p.pretrain.init_from, p.distill.student_layers,
                           p.distill.teacher)


FINETUNE_PARAMS = tuple(f"finetune.{k}" for k in (
    "seeds", "init", "max_seq_len", "batch_size", "lr", "lr_grid", "weight_decay", "epochs",
    "min_steps", "evals_per_epoch", "patience", "train_last_k", "label_subwords", "crf",
    "span_threshold", "onnx", "precision", "grad_clip", "deterministic", "workers"))

TEACHER_PARAMS = tuple(p for p in FINETUNE_PARAMS
                       if p not in ("finetune.seeds", "finetune.lr", "finetune.lr_grid", "finetune.onnx"))

STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("ingest", _ingest, ("ingest",), replaces=lambda p, task: ("paths.raw", p.paths.raw)),
    Stage("clean", _clean, ("clean",), replaces=lambda p, task: ("paths.clean", p.paths.clean)),
    Stage("checkpoint", _checkpoint, ("pretrain.init_from",),
          replaces=lambda p, task: ("paths.checkpoint", p.paths.checkpoint)),
    Stage("tokenizer", _tokenizer, ("tokenizer", "model.max_position", "pretrain.init_from"),
          replaces=lambda p, task: ("paths.tokenizer", p.paths.tokenizer),
          artifacts=lambda p, root, task: [root / p.paths.tokenizer]),
    Stage("pairs", _pairs, ("pairs",), replaces=lambda p, task: ("paths.pairs", p.paths.pairs)),
    Stage("pretrain", _pretrain, ("model", "pretrain"), own_process=True,
          replaces=lambda p, task: ("paths.models (encoder)", f"{p.paths.models}/encoder"),
          artifacts=lambda p, root, task: [root / p.paths.metrics / "pretrain_curve.png"]),
    Stage("task_data", _task_data, ("finetune.tasks.{task}",), per_task=True,
          replaces=lambda p, task: (f"paths.tasks ({task})", f"{p.paths.tasks}/{task}")),
    Stage("adapt", _adapt, ("adapt", "finetune.init", "finetune.tasks.{task}", "model", "pretrain"),
          per_task=True,
          replaces=lambda p, task: (f"paths.models (adapted/{task})", f"{p.paths.models}/adapted/{task}")),
    # The student's own settings (seeds, rates, temperature) rerun no teacher.
    Stage("teacher", _teacher, ("distill.teacher", "distill.teacher_seeds", "distill.teacher_lr_grid",
                                "finetune.tasks.{task}", *TEACHER_PARAMS), per_task=True,
          replaces=lambda p, task: (f"paths.models (teachers/{task})", f"{p.paths.models}/teachers/{task}")),
    Stage("transfer_set", _transfer_set,
          ("distill.augment_copies", "distill.augment_prob", "distill.augment_top_k", "distill.corpus_rows",
           "distill.seed", "finetune.init", "finetune.tasks.{task}", "finetune.max_seq_len",
           "finetune.batch_size"),
          per_task=True, replaces=lambda p, task: (f"paths.models (transfer-set/{task})",
                                                   f"{p.paths.models}/transfer-set/{task}")),
    Stage("finetune", _finetune, ("finetune.tasks.{task}", *FINETUNE_PARAMS, "distill.temperature",
                                  "distill.alpha", "distill.student_layers", "distill.teacher",
                                  "distill.teacher_lr_grid"), per_task=True,
          replaces=lambda p, task: (f"paths.models (tasks/{task})", f"{p.paths.models}/tasks/{task}")),
    Stage("evaluate", _evaluate, ("finetune.tasks.{task}", "evaluate"), per_task=True,
          artifacts=lambda p, root, task: sorted((root / p.paths.metrics / "tasks" / task).glob("*.png"))),
    Stage("transfer", _transfer, ("finetune.tasks", "evaluate", "pretrain.init_from",
                                  "distill.student_layers", "distill.teacher"),
          artifacts=lambda p, root, task: [root / p.paths.metrics / "transfer.md"]),
]}


def split_name(name: str) -> tuple[Stage, str]:
    """`finetune@trec-6` -> (the finetune stage, "trec-6"); a stage without a task -> (stage, "")."""
    base, _, task = name.partition("@")
    if base not in STAGES:
        raise BertflowError(f"unknown stage {base!r} (stages: {', '.join(STAGES)})")
    stage = STAGES[base]
    if stage.per_task and not task:
        raise BertflowError(f"stage {base} runs per task: name it {base}@TASK")
    if task and not stage.per_task:
        raise BertflowError(f"stage {base} is not per task: name it {base}")
    return stage, task


def stage_params(stage: Stage, task: str) -> list[str]:
    """The params.yaml keys a stage (of a task) reads."""
    return [key.format(task=task) for key in stage.params]


def plan(p: Params, until: str | None = None) -> list[str]:
    """Stage names in run order (a per-task stage once per task), up to and including every
    stage named `until`; for one task's stage (`finetune@trec-6`), only what that task needs."""
    names = []
    for stage in STAGES.values():
        names += [f"{stage.name}@{t}" for t in p.finetune.tasks] if stage.per_task else [stage.name]
    if until is None:
        return names
    stage, task = split_name(until) if "@" in until else (STAGES.get(until), "")
    if stage is None:
        raise BertflowError(f"unknown stage {until!r} (stages: {', '.join(STAGES)})")
    if task and task not in p.finetune.tasks:
        raise BertflowError(f"unknown task {task!r} (tasks: {', '.join(p.finetune.tasks)})")
    if task:
        names = [n for n in names if n.partition("@")[2] in ("", task)]
    last = max(i for i, n in enumerate(names) if n == until or n.partition("@")[0] == until)
    return names[: last + 1]


def check_outputs_owned(p: Params, root: Path, names: list[str]) -> None:
    """Before the stages `names` run: each folder they replace whole is missing, empty or
    bertflow's (components.core.guard), or one line names the key and the folder."""
    from components.core.guard import claim

    for name in names:
        stage, task = split_name(name)
        if stage.replaces is not None:
            key, folder = stage.replaces(p, task)
            claim(root / folder, key)


def metrics_file(p: Params, root: Path, name: str) -> Path:
    """Where a stage's stats go (a DVC metrics file, kept in git)."""
    base, _, task = name.partition("@")
    if task:
        return root / p.paths.metrics / "tasks" / task / f"{base}_stats.json"
    return root / p.paths.metrics / f"{name}_stats.json"


def lookup(data: dict, dotted: str) -> Any:
    """`lookup(d, "a.b")` is `d["a"]["b"]`."""
    for part in dotted.split("."):
        data = data[part]
    return data


def _open_run(name: str, params_path: Path, p: Params, parent_run_id: str | None, status: str,
              key: str | None = None):
    """The stage's MLflow run with its params and lineage tags: the git commit and the hashes
    DVC records in dvc.lock for the stage's deps (a flow's stage that runs gets those from its
    flow, once it has recorded it: DVC hashes its deps then). A task not in params is refused
    first, before anything is recorded."""
    from components.core import tracking
    from pipeline import versioning

    root = params_path.parent
    _check_task(p, split_name(name)[1], params_path)
    if parent_run_id is None:  # a stage on its own (by hand, or dvc repro's): as a flow does first
        tracking.close_dead_runs(p.tracking, root)
    tags = {"bertflow.stage": name, "bertflow.status": status,
            "bertflow.params_file": str(params_path), **tracking.git_state(root)}
    if versioning.tracks(params_path):  # a preset's stage has no dvc.lock entry
        if status == "skipped":
            tags.update(versioning.recorded_dep_hashes(root, name))
        elif parent_run_id is None:
            tags.update(versioning.dep_hashes(root, name))
    run = tracking.mlflow_run(p.tracking, root, name, parent_run_id=parent_run_id, tags=tags, key=key)
    return root, run


def _check_task(p: Params, task: str, params_path: Path) -> None:
    if task and task not in p.finetune.tasks:
        raise BertflowError(f"{params_path}: no task {task!r} in finetune.tasks "
                            f"(tasks: {', '.join(p.finetune.tasks)})")


def distributed_rank() -> int:
    """This process's rank in a multi-process run (0 when not distributed). Lightning's
    launcher, torchrun and SLURM set these variables for every rank they start."""
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "0") != "0":
            return int(os.environ[var])
    return 0


def run_stage(name: str, params_path: Path, parent_run_id: str | None = None,
              run_key: str | None = None, p: Params | None = None) -> dict:
    """Run one stage under an MLflow run: params, stats as metrics, artifacts, lineage tags.
    Attempts with one `run_key` (retries of a Prefect task run) share one MLflow run. `p` is
    params_path's content when the caller has read it already: params load once per stage.

    Ranks other than 0 of a distributed run only compute: no run, no files, no records.
    """
    from components.core.io import write_json

    stage, task = split_name(name)
    params_path = Path(params_path).resolve()
    p = p or load_params(params_path)
    if distributed_rank() != 0:
        return stage.call(p, params_path.parent, None, task)
    parent_run_id = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
    run_key = run_key or os.environ.get(RUN_KEY_ENV) or None
    root, opened = _open_run(name, params_path, p, parent_run_id, "ran", run_key)
    with opened as run:
        run.log_params({key: lookup(p.model_dump(), key) for key in stage_params(stage, task)})
        start = time.perf_counter()
        stats = stage.call(p, root, run, task)
        # Facts of this execution (wall minutes, workers, a resume) go to MLflow only: the
        # metrics file is a DVC output, equal on every rerun with the same inputs.
        this_run = {"seconds": time.perf_counter() - start, **stats.pop("this_run", {})}
        out = metrics_file(p, root, name)
        write_json(out, stats)
        run.log_metrics({**stats, "this_run": this_run})
        run.set_tags({f"bertflow.this_run.{k}": v for k, v in this_run.items() if isinstance(v, str)})
        run.set_tags({f"bertflow.machine.{k}": v for k, v in stats.get("machine", {}).items()})
        if stats.get("stopped_by") == "max_minutes":
            run.set_tags({"bertflow.guard_fired": f"pretrain.max_minutes at step {stats['steps']} "
                                                  f"of {stats['max_steps']}"})
        run.log_artifact(out)
        for path in stage.artifacts(p, root, task):
            run.log_artifact(path, path.name)
    log.info("stage %s done in %.1f s", name, this_run["seconds"])
    return stats


def record_skipped(name: str, params_path: Path, parent_run_id: str | None) -> dict:
    """An MLflow run for a stage DVC found up to date: the same params and lineage, and the
    stats of the outputs it keeps."""
    from components.core.io import read_json

    stage, task = split_name(name)
    params_path = Path(params_path).resolve()
    p = load_params(params_path)
    root, opened = _open_run(name, params_path, p, parent_run_id, "skipped")
    stats_path = metrics_file(p, root, name)
    stats = read_json(stats_path) if stats_path.exists() else {}
    with opened as run:
        run.log_params({key: lookup(p.model_dump(), key) for key in stage_params(stage, task)})
        run.log_metrics(stats)
    return stats
