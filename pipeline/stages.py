"""The stages: what each reads from params.yaml, the folders it reads and writes, and which
component function it calls.

`run_stage` is what both `bertflow stage NAME` (called by dvc.yaml) and the Prefect flow run, so
the two paths share every line that matters. Stage order here is the DAG order. The table is
the one place a stage's folders are named: dvc.yaml is generated from it (pipeline.deps), and
each entry's call gets them resolved (`Target`). Each entry imports the component functions it
calls inside its body: pipeline.deps reads those imports to write the stage's code deps.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.core.config import FinetuneConfig, Params
from components.core.errors import BertflowError
from components.core.params import load_params
from pipeline.placement import ALL, ONE_CORE, Needs

if TYPE_CHECKING:
    from components.core.tracking import MlflowRun
    from components.training.workers import Cluster

log = logging.getLogger(__name__)
PARENT_RUN_ENV = "BERTFLOW_PARENT_RUN_ID"  # set by the flow for stages it runs as a subprocess
RUN_KEY_ENV = "BERTFLOW_RUN_KEY"  # and the key that makes its retries reopen one MLflow run
_VAR = re.compile(r"\$\{([^}]+)\}")


def lookup(data: dict, dotted: str) -> Any:
    """`lookup(d, "a.b")` is `d["a"]["b"]`."""
    for part in dotted.split("."):
        data = data[part]
    return data


def resolve(template: str, p: Params, task: str = "", start: str = "") -> str:
    """A path template of the table (`${paths.models}/tasks/{task}/{start}`, dvc.yaml's own
    syntax for the params) with `p`'s values, the task and the start."""
    values = p.model_dump(mode="json")
    template = template.replace("{task}", task).replace("{start}", start)
    return _VAR.sub(lambda m: str(lookup(values, m[1])), template)


@dataclass(frozen=True)
class Target:
    """Where a stage runs: the params, the project root, the stage, its task and start ('' if
    none)."""

    p: Params
    root: Path
    stage: str
    task: str = ""
    start: str = ""

    def folder(self, stage: str) -> Path:
        """The folder stage `stage` writes (for this target's task and start)."""
        return self.path(STAGES[stage].writes)

    def start_folder(self, start: str) -> Path:
        """The folder of the fits of the task's start `start`."""
        return self.root / resolve(STAGES[start_stage(start)].writes, self.p, self.task, start)

    @property
    def name(self) -> str:
        """The stage's name: `finetune@trec-6-scratch`."""
        item = "-".join(filter(None, (self.task, self.start)))
        return f"{self.stage}@{item}" if item else self.stage

    @property
    def out(self) -> Path:
        """This stage's own folder."""
        return self.folder(self.stage)

    def path(self, template: str) -> Path:
        """A path template of the table, resolved under the root."""
        return self.root / resolve(template, self.p, self.task, self.start)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage."""

    name: str
    call: Callable[[Params, Target, MlflowRun | None], dict]
    """Calls the component function with the stage's folders resolved (`Target`) and its MLflow
    run (None on the non-zero ranks of a distributed run)."""
    params: tuple[str, ...]
    """params.yaml keys it reads: exactly dvc.yaml's `params:` list; in a per-task stage,
    `{task}` stands for the task's name."""
    writes: str = ""
    """The folder it writes whole, as a path template (`{task}`: the task); it is replaced only
    when bertflow made it (components.core.guard). A persisted DVC output."""
    reads: tuple[str, ...] = ()
    """What it reads besides params and the code: other stages (by name: the folder each
    writes) or path templates. DVC deps, in this order."""
    per_task: bool = False
    """One stage per task of finetune.tasks (a dvc.yaml `foreach`), named `stage@task`."""
    starts: tuple[str, ...] = ()
    """A stage per task and start: one for each of these starts that finetune.init names, named
    `stage@task-start` (a `foreach` over dvc.yaml's `fits`); `{start}` in its paths."""
    used: Callable[[Params], bool] = field(default=lambda p: True)
    """Whether the params run it at all (a start's own stages: only with that start)."""
    metric: bool = False
    """Its stats file is a DVC metric (`dvc metrics show`); every stats file is an output."""
    files: tuple[str, ...] = ()
    """Other outputs it writes (path templates): small files git keeps (DVC `cache: false`)."""
    plots: tuple[tuple[str, dict], ...] = ()
    """Plot files it writes (path templates) with their dvc.yaml options, kept in git too."""
    artifacts: Callable[[Target], list[Path]] = field(default=lambda at: [])
    """Small outputs to attach to the MLflow run besides the stats."""
    own_process: bool = False
    """The flow runs it as `bertflow stage NAME`: Lightning's DDP launcher starts the other
    ranks by re-running the current command, which must be the stage, not the whole flow."""
    needs: Needs = Needs()
    """What it holds while it runs (pipeline.placement): the flow starts it when these are free."""
    fit: Needs | None = None
    """What each of its fits holds, for a stage that trains fits: with `executor.kind: dask` they
    are tasks on the cluster, and the stage holds one core here."""

    @property
    def per_start(self) -> bool:
        """Whether it runs once per task and start."""
        return bool(self.starts)

    @property
    def stats(self) -> str:
        """Its stats file (a path template): what it returns, kept in git."""
        where = "${paths.metrics}/tasks/{task}" if self.per_task else "${paths.metrics}"
        return f"{where}/{self.name}{'-{start}' if self.per_start else ''}_stats.json"


def _ingest(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.data.ingest import ingest

    return ingest(p.ingest, at.root, at.root / p.paths.packages, at.out)


def _clean(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.data.clean import clean

    return clean(p.clean, p.executor, at.folder("ingest"), at.out)


def _checkpoint(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.model.checkpoint import import_checkpoint

    return import_checkpoint(p.pretrain.init_from, at.root, at.root / p.paths.packages, at.out)


def _tokenizer(p: Params, at: Target, run: MlflowRun | None) -> dict:
    if p.pretrain.init_from:  # the checkpoint's embeddings index its own vocabulary
        from components.model.checkpoint_tokenizer import adopt_tokenizer

        return adopt_tokenizer(p.pretrain.init_from, at.folder("checkpoint"), at.folder("clean"), at.out)
    from components.data.tokenizer import train_tokenizer

    return train_tokenizer(p.tokenizer, at.folder("clean"), at.out, max_len=p.model.max_position)


def _pairs(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.data.pairs import make_pairs

    return make_pairs(p.pairs, p.executor, at.folder("clean"), at.folder("tokenizer"), at.out)


PRETRAIN_CURVE = "${paths.metrics}/pretrain_curve"  # .csv (a DVC plot) and .png


def _pretrain(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.evaluation.plots import write_pretrain_curve
    from components.training.pretrain import pretrain

    stats = pretrain(model=p.model, cfg=p.pretrain, pairs_dir=at.folder("pairs"),
                     tokenizer_dir=at.folder("tokenizer"), out_dir=at.out,
                     work_dir=at.root / p.paths.models / "pretrain-snapshots",
                     checkpoint_dir=at.folder("checkpoint") if p.pretrain.init_from else None,
                     mlflow_run=(run.uri, run.run_id) if run else None)
    if run is None:  # a non-zero rank: rank 0 writes and records everything
        return stats
    history = stats.pop("history")
    curve = at.path(PRETRAIN_CURVE)
    write_pretrain_curve(history, curve.with_suffix(".csv"), curve.with_suffix(".png"))
    return stats  # the encoder is registered after the run (pipeline.publish), once per content


def _task_data(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.data.tasks.prepare import prepare_task

    return prepare_task(at.task, p.finetune.tasks[at.task], at.root, at.root / p.paths.packages, at.out)


def _adapt(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.training.adapt import adapt_task

    stats = adapt_task(p.adapt, p.finetune.tasks[at.task], p.model, p.pretrain, at.folder("task_data"),
                       at.folder("pretrain"), at.out, at.root / p.paths.models / "adapt-snapshots" / at.task,
                       mlflow_run=(run.uri, run.run_id) if run else None)
    stats.pop("history", None)  # in the adapted encoder's bertflow.json and the MLflow curves
    return stats


def _teacher(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.training.teacher import fit_teacher

    stats = fit_teacher(at.task, p.finetune.tasks[at.task], p.finetune, p.distill, at.root,
                        at.root / p.paths.packages, at.folder("task_data"), at.out, fits_cluster(p, at))
    if run is not None:
        run.log_artifact(at.out / "model", "model")
        _log_search(p, at, run, stats)
    return stats


def _transfer_set(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.training.transfer_set import build_transfer

    return build_transfer(at.task, p.finetune.tasks[at.task], p.finetune, p.distill, at.folder("task_data"),
                          at.folder("pretrain"), at.folder("teacher"), at.out, at.folder("clean"))


# The stage whose folder holds the weights a start begins from (scratch: the encoder's shape and
# tokenizer), and the one that writes the start's fits.
START_WEIGHTS = {"pretrained": "pretrain", "scratch": "pretrain", "checkpoint": "checkpoint",
                 "adapted": "adapt"}


def start_stage(start: str) -> str:
    """The stage that trains the fits of start `start`."""
    return "distill" if start == "distilled" else "finetune"


def start_name(task: str, start: str) -> str:
    """The name of the stage that trains the fits of a task's start: `finetune@trec-6-scratch`."""
    return f"distill@{task}" if start == "distilled" else f"finetune@{task}-{start}"


def _finetune(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.training.finetune import finetune_start

    weights = at.folder(START_WEIGHTS[at.start]) if at.start in ("checkpoint", "adapted") else None
    stats = finetune_start(at.task, p.finetune.tasks[at.task], p.finetune, init=at.start,
                           task_dir=at.folder("task_data"), encoder_dir=at.folder("pretrain"), out_dir=at.out,
                           weights_dir=weights, cluster=fits_cluster(p, at))
    if run is not None:
        run.log_artifact(at.out / "model", "model")
        _log_search(p, at, run, stats)
    return stats


def _distill(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.training.finetune import distill_student
    from components.training.student import student_encoder

    with student_encoder(p.distill, at.root, at.root / p.paths.packages, at.out.parent) as student:
        stats = distill_student(at.task, p.finetune.tasks[at.task], p.finetune, p.distill,
                                task_dir=at.folder("task_data"), encoder_dir=at.folder("pretrain"),
                                transfer_dir=at.folder("transfer_set"), out_dir=at.out, student_dir=student,
                                cluster=fits_cluster(p, at))
    if run is not None:
        run.log_artifact(at.out / "model", "model")
        _log_search(p, at, run, stats)
    return stats


def fits_cluster(p: Params, at: Target) -> Cluster | None:
    """Where the stage's fits train: the Dask cluster of `executor.kind: dask`, else here (None)."""
    from components.training.workers import Cluster

    fit = STAGES[at.stage].fit
    if p.executor.kind != "dask" or fit is None:
        return None
    return Cluster(p.executor.dask_address, fit.dask_resources())


def held(p: Params, name: str) -> Needs:
    """What stage `name` holds on the machine running the flow: its needs, or one core when its
    fits train on a cluster."""
    stage = split_name(name)[0]
    return ONE_CORE if stage.fit is not None and p.executor.kind == "dask" else stage.needs


def _log_search(p: Params, at: Target, run: MlflowRun, stats: dict) -> None:
    """Each trial of the start's learning-rate search as a child run of the stage's MLflow run
    (a retry of the stage reopens the same children)."""
    from components.core.tracking import mlflow_run

    search = stats.get("search")
    for lr, trial in (search["trials"].items() if search else ()):
        with mlflow_run(p.tracking, at.root, f"{at.name} lr={lr}", parent_run_id=run.run_id,
                        key=f"{run.run_id}/{lr}") as child:
            child.log_params({"seed": p.finetune.seeds[0], "lr": lr})
            child.log_metrics({**trial, "minutes": stats["this_run"][f"search.{lr}.minutes"]})
            child.set_tags({"bertflow.lr_chosen": lr == f"{search['lr']:g}"})


EVALUATIONS = "${paths.metrics}/tasks"  # evaluate's figures and plots, a folder per task
TASK_METRICS = f"{EVALUATIONS}/{{task}}"


def _evaluate(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.evaluation.evaluate import evaluate_task

    return evaluate_task(at.task, p.finetune.tasks[at.task], p.evaluate, at.folder("task_data"),
                         {start: at.start_folder(start) for start in p.finetune.init}, at.folder("pretrain"),
                         at.path(TASK_METRICS))


TRANSFER = "${paths.metrics}/transfer"  # .md and .json: what pretraining bought, per task


def _transfer(p: Params, at: Target, run: MlflowRun | None) -> dict:
    from components.evaluation.transfer import transfer_report

    report = at.path(TRANSFER)
    return transfer_report(list(p.finetune.tasks), at.path(EVALUATIONS), report.with_suffix(".md"),
                           report.with_suffix(".json"), p.pretrain.init_from, p.distill.student_layers,
                           p.distill.teacher, p.evaluate.encoder_spread)


def _task_keys(*keys: str) -> tuple[str, ...]:
    """A task's params: its own entry, and the keys of finetune.task_defaults that the stage reads."""
    return ("finetune.tasks.{task}", *(f"finetune.task_defaults.{k}" for k in keys))


# What reaches a fit: the task's protocol, and every finetune setting but the task list and starts.
FIT_TASK_KEYS = ("max_seq_len", "long_text", "chunk_overlap", "epochs", "patience", "max_span_words",
                 "span_decoding", "tag_decoding")
FIT_PARAMS = tuple(f"finetune.{k}" for k in FinetuneConfig.model_fields
                   if k not in ("tasks", "task_defaults", "init"))
TEACHER_PARAMS = ("distill.teacher", "distill.teacher_seeds", *_task_keys(*FIT_TASK_KEYS, "teacher_lr"),
                  *(k for k in FIT_PARAMS if k not in ("finetune.seeds", "finetune.onnx")))


def distilled(p: Params) -> bool:
    """Whether the params run the `distilled` start (its stages exist only then)."""
    return "distilled" in p.finetune.init


# What each stage holds while it runs: the cores its processes use (ALL: the data stages' and the
# local fits' process per core, torch's threads), GPUs where there are some, and its resident
# memory at peak on the default params (an estimate, rounded up). A fit: one core, one GPU.
FIT = Needs(1, 1, 2)

STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("ingest", _ingest, ("ingest",), needs=Needs(1, 0, 2), writes="${paths.raw}"),
    Stage("clean", _clean, ("clean",), needs=Needs(ALL, 0, 4), writes="${paths.clean}", reads=("ingest",)),
    # pretrain.init_from, checked and converted (an empty folder record when unset). A checkpoint
    # folder of your own belongs under data/user (`dvc add` it): DVC then sees its edits.
    Stage("checkpoint", _checkpoint, ("pretrain.init_from",), needs=Needs(1, 0, 2),
          writes="${paths.checkpoint}"),
    Stage("tokenizer", _tokenizer, ("tokenizer", "model.max_position", "pretrain.init_from"),
          needs=Needs(ALL, 0, 2),
          writes="${paths.tokenizer}", reads=("clean", "checkpoint"), artifacts=lambda at: [at.out]),
    Stage("pairs", _pairs, ("pairs",), needs=Needs(ALL, 0, 4), writes="${paths.pairs}",
          reads=("clean", "tokenizer")),
    Stage("pretrain", _pretrain, ("model", "pretrain"), needs=Needs(ALL, ALL, 8),
          writes="${paths.models}/encoder",
          reads=("pairs", "tokenizer", "checkpoint"), metric=True, own_process=True,
          plots=((f"{PRETRAIN_CURVE}.csv", {"x": "tokens", "y": "mlm_accuracy",
                                            "title": "Held-out MLM accuracy by training tokens"}),
                 (f"{PRETRAIN_CURVE}.png", {})),
          artifacts=lambda at: [at.path(f"{PRETRAIN_CURVE}.png")]),
    Stage("task_data", _task_data, _task_keys("columns", "labels", "scheme", "split", "split_seed",
                                              "max_train_examples", "max_span_words"),
          writes="${paths.tasks}/{task}", per_task=True, needs=Needs(1, 0, 1)),
    # The `adapted` start: the encoder continued on the task's own text.
    Stage("adapt", _adapt, ("adapt", "finetune.tasks.{task}", "model", "pretrain"), needs=Needs(ALL, 1, 4),
          writes="${paths.models}/adapted/{task}", reads=("task_data", "pretrain"), per_task=True,
          used=lambda p: "adapted" in p.finetune.init),
    # The `distilled` start: the task's teacher, a checkpoint fine-tuned on it; the transfer set
    # it labels with soft targets; the student trained on them. The student's own settings (seeds,
    # rates, temperature) rerun no teacher.
    Stage("teacher", _teacher, TEACHER_PARAMS, needs=Needs(ALL, 1, 8), fit=Needs(1, 1, 3),
          writes="${paths.models}/teachers/{task}", reads=("task_data",),
          per_task=True, used=distilled),
    Stage("transfer_set", _transfer_set,
          ("distill.augment_copies", "distill.augment_prob", "distill.augment_top_k", "distill.corpus_rows",
           "distill.seed", *_task_keys("max_seq_len", "long_text", "chunk_overlap", "max_span_words",
                                       "transfer_corpus", "transfer_pairs", "pair_link"),
           "finetune.batch_size"),
          needs=Needs(ALL, 1, 4),
          writes="${paths.models}/transfer-set/{task}", reads=("task_data", "clean", "pretrain", "teacher"),
          per_task=True, used=distilled),
    # The fits of each start: a stage per task and start, so a new or changed start trains only
    # its own fits.
    Stage("finetune", _finetune, (*_task_keys(*FIT_TASK_KEYS, "lr"), *FIT_PARAMS),
          needs=Needs(ALL, 1, 6), fit=FIT,
          writes="${paths.models}/tasks/{task}/{start}", reads=("task_data", "pretrain", "{weights}"),
          per_task=True, starts=tuple(START_WEIGHTS)),
    Stage("distill", _distill, (*_task_keys(*FIT_TASK_KEYS, "lr", "teacher_lr"), *FIT_PARAMS,
                                "distill.temperature", "distill.alpha", "distill.student_layers",
                                "distill.teacher"),
          needs=Needs(ALL, 1, 6), fit=FIT,
          writes="${paths.models}/tasks/{task}/distilled", reads=("task_data", "pretrain", "transfer_set"),
          per_task=True, used=distilled),
    Stage("evaluate", _evaluate, ("finetune.tasks.{task}", "finetune.init", "evaluate.tfidf_baseline"),
          needs=Needs(1, 0, 2), reads=("task_data", "pretrain", "{starts}"), per_task=True,
          plots=((f"{TASK_METRICS}/curves.csv", {"x": "step", "y": "val_metric", "template": "linear"}),
                 (f"{TASK_METRICS}/per_class.csv", {"x": "label", "y": "f1", "template": "bar_horizontal"}),
                 (f"{TASK_METRICS}/curves.png", {}), (f"{TASK_METRICS}/per_class.png", {})),
          artifacts=lambda at: sorted(at.path(TASK_METRICS).glob("*.png"))),
    Stage("transfer", _transfer, ("finetune.tasks", "evaluate.encoder_spread", "pretrain.init_from",
                                  "distill.student_layers", "distill.teacher"),
          needs=Needs(1, 0, 1),
          reads=(EVALUATIONS,), metric=True, files=(f"{TRANSFER}.md", f"{TRANSFER}.json"),
          artifacts=lambda at: [at.path(f"{TRANSFER}.md")]),
]}


def split_name(name: str) -> tuple[Stage, str, str]:
    """`finetune@trec-6-scratch` -> (the finetune stage, "trec-6", "scratch"); `evaluate@trec-6`
    -> (the evaluate stage, "trec-6", ""); a stage without a task -> (stage, "", "")."""
    base, _, item = name.partition("@")
    if base not in STAGES:
        raise BertflowError(f"unknown stage {base!r} (stages: {', '.join(STAGES)})")
    stage = STAGES[base]
    if stage.per_task and not item:
        raise BertflowError(f"stage {base} runs per task{' and start' if stage.per_start else ''}: name it "
                            f"{base}@TASK{'-START' if stage.per_start else ''}")
    if item and not stage.per_task:
        raise BertflowError(f"stage {base} is not per task: name it {base}")
    if not stage.per_start:
        return stage, item, ""
    task, _, start = item.rpartition("-")
    if start not in stage.starts or not task:
        raise BertflowError(f"stage {name}: name it {base}@TASK-START, START one of "
                            f"{', '.join(stage.starts)}")
    return stage, task, start


def target(p: Params, root: Path, name: str) -> Target:
    """Where stage `name` (`finetune@trec-6-scratch`) runs."""
    stage, task, start = split_name(name)
    return Target(p, root, stage.name, task, start)


def stage_params(stage: Stage, task: str) -> list[str]:
    """The params.yaml keys a stage (of a task) reads."""
    return [key.format(task=task) for key in stage.params]


def fit_items(p: Params) -> dict[str, dict[str, str]]:
    """dvc.yaml's `fits`: each task and start of the finetune stage, with the folder holding the
    start's weights (resolved: dvc.yaml's vars take no templates)."""
    finetune = STAGES["finetune"]
    return {f"{task}-{start}": {"task": task, "start": start,
                                "weights": resolve(STAGES[START_WEIGHTS[start]].writes, p, task)}
            for task in p.finetune.tasks for start in p.finetune.init if start in finetune.starts}


def producers(p: Params, name: str) -> list[str]:
    """The stages whose folders stage `name` reads (those that run with params `p`)."""
    stage, task, start = split_name(name)
    found = []
    for read in stage.reads:
        if read == "{weights}":
            read = START_WEIGHTS[start]
        if read == "{starts}":
            found += [start_name(task, s) for s in p.finetune.init]
        elif read in STAGES:
            found.append(f"{read}@{task}" if STAGES[read].per_task else read)
        else:  # a folder of several stages' outputs (transfer's: every evaluation)
            folder = Path(resolve(read, p))
            found += [n for n, _ in _instances(p)
                      if any(Path(out).is_relative_to(folder) for out in outputs(p, n))]
    return found


def outputs(p: Params, name: str) -> list[str]:
    """Every path stage `name` writes, relative to the project root."""
    stage, task, start = split_name(name)
    paths = [stage.writes, stage.stats, *stage.files, *(f for f, _ in stage.plots)]
    return [resolve(t, p, task, start) for t in paths if t]


def _instances(p: Params) -> list[tuple[str, str]]:
    """(stage name, task) of every stage the params run, in run order."""
    names = []
    for stage in STAGES.values():
        if not stage.used(p):
            continue
        if stage.per_start:
            names += [(f"{stage.name}@{t}-{s}", t) for t in p.finetune.tasks for s in p.finetune.init
                      if s in stage.starts]
        elif stage.per_task:
            names += [(f"{stage.name}@{t}", t) for t in p.finetune.tasks]
        else:
            names.append((stage.name, ""))
    return names


def plan(p: Params, until: str | None = None) -> list[str]:
    """Stage names in run order (a per-task stage once per task, the finetune stage once per
    task and start), up to and including every stage named `until`; for one task's stage
    (`finetune@trec-6`, `evaluate@trec-6`), only what that task needs."""
    names = _instances(p)
    if until is None:
        return [n for n, _ in names]
    base, _, item = until.partition("@")
    if base not in STAGES:
        raise BertflowError(f"unknown stage {until!r} (stages: {', '.join(STAGES)})")
    task, _, start = item.rpartition("-")
    if item in p.finetune.tasks or start not in STAGES[base].starts:  # a task's stages, not one start's
        task = item
    if item and task not in p.finetune.tasks:
        raise BertflowError(f"unknown task {task!r} (tasks: {', '.join(p.finetune.tasks)})")
    if task:
        names = [(n, t) for n, t in names if t in ("", task)]
    hits = ([i for i, (n, _) in enumerate(names) if n == until]
            or [i for i, (n, _) in enumerate(names) if n.partition("@")[0] == base])
    if not hits:
        raise BertflowError(f"stage {until}: the params run no such stage (stages: "
                            f"{', '.join(dict.fromkeys(n.partition('@')[0] for n, _ in names))})")
    return [n for n, _ in names[: max(hits) + 1]]


def check_outputs_owned(p: Params, root: Path, names: list[str]) -> None:
    """Before the stages `names` run: each folder they replace whole is missing, empty or
    bertflow's (components.core.guard), or one line names the key and the folder."""
    from components.core.guard import claim

    for name in names:
        stage, task, start = split_name(name)
        if stage.writes:
            key = _VAR.match(stage.writes)[1]  # the paths key its folder lies under
            where = stage.writes.partition("}/")[2].replace("{task}", task).replace("{start}", start)
            claim(root / resolve(stage.writes, p, task, start), f"{key} ({where})" if where else key)


def metrics_file(p: Params, root: Path, name: str) -> Path:
    """Where a stage's stats go (a DVC output, kept in git)."""
    stage, task, start = split_name(name)
    return root / resolve(stage.stats, p, task, start)


def _open_run(name: str, params_path: Path, p: Params, parent_run_id: str | None, status: str,
              key: str | None = None):
    """The stage's MLflow run with its params and lineage tags: the git commit and the hashes
    DVC records in dvc.lock for the stage's deps (a flow's stage that runs gets those from its
    flow, once it has recorded it: DVC hashes its deps then). A task not in params is refused
    first, before anything is recorded."""
    from components.core import tracking
    from pipeline import pipelines, versioning

    root = params_path.parent
    _check_task(p, split_name(name)[1], params_path)
    if parent_run_id is None:  # a stage on its own (by hand, or dvc repro's): as a flow does first
        tracking.close_dead_runs(p.tracking, root)
    tags = {"bertflow.stage": name, "bertflow.status": status,
            "bertflow.params_file": str(params_path), **tracking.git_state(root)}
    address = pipelines.stage_address(params_path, name)
    if address and status == "skipped":
        tags.update(versioning.recorded_dep_hashes(root, address))
    elif address and parent_run_id is None:
        tags.update(versioning.dep_hashes(root, address))
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

    stage, task, _ = split_name(name)
    params_path = Path(params_path).resolve()
    p = p or load_params(params_path)
    if distributed_rank() != 0:
        return stage.call(p, target(p, params_path.parent, name), None)
    parent_run_id = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
    run_key = run_key or os.environ.get(RUN_KEY_ENV) or None
    root, opened = _open_run(name, params_path, p, parent_run_id, "ran", run_key)
    with opened as run:
        run.log_params({key: lookup(p.model_dump(), key) for key in stage_params(stage, task)})
        start = time.perf_counter()
        at = target(p, root, name)
        stats = stage.call(p, at, run)
        # Facts of this execution (wall minutes, workers, a resume) go to MLflow only: the
        # metrics file is a DVC output, equal on every rerun with the same inputs.
        this_run = {"seconds": time.perf_counter() - start, "host": socket.gethostname(),
                    **stats.pop("this_run", {})}
        out = metrics_file(p, root, name)
        write_json(out, stats)
        run.log_metrics({**stats, "this_run": this_run})
        run.set_tags({f"bertflow.this_run.{k}": v for k, v in this_run.items() if isinstance(v, str)})
        run.set_tags({f"bertflow.machine.{k}": v for k, v in stats.get("machine", {}).items()})
        if stats.get("stopped_by") == "max_minutes":
            run.set_tags({"bertflow.guard_fired": f"pretrain.max_minutes at step {stats['steps']} "
                                                  f"of {stats['max_steps']}"})
        run.log_artifact(out)
        for path in stage.artifacts(at):
            run.log_artifact(path, path.name)
    log.info("stage %s done in %.1f s", name, this_run["seconds"])
    return stats


def record_skipped(name: str, params_path: Path, parent_run_id: str | None) -> dict:
    """An MLflow run for a stage DVC found up to date: the same params and lineage, and the
    stats of the outputs it keeps."""
    from components.core.io import read_json

    stage, task, _ = split_name(name)
    params_path = Path(params_path).resolve()
    p = load_params(params_path)
    root, opened = _open_run(name, params_path, p, parent_run_id, "skipped")
    stats_path = metrics_file(p, root, name)
    stats = read_json(stats_path) if stats_path.exists() else {}
    with opened as run:
        run.log_params({key: lookup(p.model_dump(), key) for key in stage_params(stage, task)})
        run.log_metrics(stats)
    return stats
