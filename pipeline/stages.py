"""The stages: what each reads from params.yaml and which component function it calls.

`run_stage` is what both `bertflow stage NAME` (called by dvc.yaml) and the Prefect flow run, so
the two paths share every line that matters. Stage order here is the DAG order of dvc.yaml.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import Params, load_params, to_dict
from components.errors import BertflowError

if TYPE_CHECKING:
    from components.tracking import Run

log = logging.getLogger(__name__)
PARENT_RUN_ENV = "BERTFLOW_PARENT_RUN_ID"  # set by the flow for stages it runs as a subprocess


@dataclass(frozen=True)
class Stage:
    """One pipeline stage."""

    name: str
    run: Callable[[Params, Path, Run | None], dict]
    """Calls the component function with paths resolved against the project root (and the
    stage's MLflow run, None on the non-zero ranks of a distributed run)."""
    params: tuple[str, ...]
    """params.yaml keys it reads: exactly dvc.yaml's `params:` list (a test keeps them equal)."""
    artifacts: Callable[[Params, Path], list[Path]] = field(default=lambda p, root: [])
    """Small outputs to attach to the MLflow run besides the stats."""
    own_process: bool = False
    """The flow runs it as `bertflow stage NAME`: Lightning's DDP launcher starts the other
    ranks by re-running the current command, which must be the stage, not the whole flow."""


def _ingest(p: Params, root: Path, run: Run | None) -> dict:
    from components.corpus import ingest

    return ingest(p.ingest, root, root / p.paths.packages, root / p.paths.raw)


def _clean(p: Params, root: Path, run: Run | None) -> dict:
    from components.corpus import clean

    return clean(p.clean, p.executor, root / p.paths.raw, root / p.paths.clean)


def _tokenizer(p: Params, root: Path, run: Run | None) -> dict:
    from components.tokenizer import train_tokenizer

    return train_tokenizer(p.tokenizer, root / p.paths.clean, root / p.paths.tokenizer,
                           max_len=p.model.max_position)


def _pairs(p: Params, root: Path, run: Run | None) -> dict:
    from components.pairs import make_pairs

    return make_pairs(p.pairs, p.executor, root / p.paths.clean, root / p.paths.tokenizer,
                      root / p.paths.pairs)


def _pretrain(p: Params, root: Path, run: Run | None) -> dict:
    from components.pretrain import pretrain, write_curve

    encoder = root / p.paths.models / "encoder"
    stats = pretrain(p.model, p.pretrain, root / p.paths.pairs, root / p.paths.tokenizer, encoder,
                     root / p.paths.models / "pretrain-checkpoints",
                     mlflow_run=(run.uri, run.run_id) if run else None)
    if run is None:  # a non-zero rank: rank 0 writes and records everything
        return stats
    history = stats.pop("history")
    write_curve(history, root / p.paths.metrics / "pretrain_curve.csv",
                root / p.paths.metrics / "pretrain_curve.png")
    run.log_artifact(encoder, "encoder")
    stats["registered_version"] = run.register(
        "encoder", "encoder", alias="candidate",
        tags={"mlm_accuracy": f"{stats['mlm_accuracy']:.4f}", "bertflow.stage": "pretrain"})
    return stats


STAGES: dict[str, Stage] = {s.name: s for s in [
    Stage("ingest", _ingest, ("ingest",)),
    Stage("clean", _clean, ("clean",)),
    Stage("tokenizer", _tokenizer, ("tokenizer", "model.max_position"),
          artifacts=lambda p, root: [root / p.paths.tokenizer]),
    Stage("pairs", _pairs, ("pairs",)),
    Stage("pretrain", _pretrain, ("model", "pretrain"), own_process=True,
          artifacts=lambda p, root: [root / p.paths.metrics / "pretrain_curve.png"]),
]}


def metrics_file(p: Params, root: Path, stage: str) -> Path:
    """Where a stage's stats go (a DVC metrics file, kept in git)."""
    return root / p.paths.metrics / f"{stage}_stats.json"


def lookup(data: dict, dotted: str) -> Any:
    """`lookup(d, "a.b")` is `d["a"]["b"]`."""
    for part in dotted.split("."):
        data = data[part]
    return data


def stages_until(until: str | None) -> list[str]:
    """Stage names in DAG order, up to and including `until`."""
    names = list(STAGES)
    if until is None:
        return names
    if until not in STAGES:
        raise BertflowError(f"unknown stage {until!r} (stages: {', '.join(names)})")
    return names[: names.index(until) + 1]


def _open_run(name: str, params_path: Path, parent_run_id: str | None, status: str):
    """The stage's MLflow run with its params and lineage tags: the git commit and the hashes
    DVC records in dvc.lock for the stage's deps."""
    from components import tracking
    from pipeline import versioning

    root = params_path.parent
    p = load_params(params_path)
    tags = {"bertflow.stage": name, "bertflow.status": status,
            "bertflow.params_file": str(params_path), **tracking.git_state(root)}
    if versioning.is_dvc_project(root):
        tags.update(versioning.dep_hashes(root, name))
    run = tracking.run(p.tracking, root, name, parent_run_id=parent_run_id, tags=tags)
    return p, root, run


def distributed_rank() -> int:
    """This process's rank in a multi-process run (0 when not distributed). Lightning's
    launcher, torchrun and SLURM set these variables for every rank they start."""
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "0") != "0":
            return int(os.environ[var])
    return 0


def run_stage(name: str, params_path: Path, parent_run_id: str | None = None) -> dict:
    """Run one stage under an MLflow run: params, stats as metrics, artifacts, lineage tags.

    Ranks other than 0 of a distributed run only compute: no run, no files, no records.
    """
    from components.io import write_json

    stage = STAGES[name]
    params_path = Path(params_path).resolve()
    if distributed_rank() != 0:
        return stage.run(load_params(params_path), params_path.parent, None)
    parent_run_id = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
    p, root, opened = _open_run(name, params_path, parent_run_id, "ran")
    with opened as run:
        run.log_params({key: lookup(to_dict(p), key) for key in stage.params})
        start = time.perf_counter()
        stats = stage.run(p, root, run)
        seconds = time.perf_counter() - start
        out = metrics_file(p, root, name)
        write_json(out, stats)
        run.log_metrics({**stats, "seconds": seconds})
        run.log_artifact(out)
        for path in stage.artifacts(p, root):
            run.log_artifact(path, path.name)
    log.info("stage %s done in %.1f s", name, seconds)
    return stats


def record_skipped(name: str, params_path: Path, parent_run_id: str | None) -> dict:
    """An MLflow run for a stage DVC found up to date: the same params and lineage, and the
    stats of the outputs it keeps."""
    from components.io import read_json

    stage = STAGES[name]
    params_path = Path(params_path).resolve()
    p, root, opened = _open_run(name, params_path, parent_run_id, "skipped")
    stats_path = metrics_file(p, root, name)
    stats = read_json(stats_path) if stats_path.exists() else {}
    with opened as run:
        run.log_params({key: lookup(to_dict(p), key) for key in stage.params})
        run.log_metrics(stats)
    return stats
