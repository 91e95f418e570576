"""After the stages: register the encoder and every evaluated task model in the MLflow registry,
with lineage tags (git commit, params hash, the dvc.lock hashes of the data), and let each new
task model challenge its champion. A model already registered is not registered again, so a
run in which nothing changed registers nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

from components.core.config import Params
from components.core.errors import BertflowError
from components.core.io import read_json
from components.core.params import load_params
from components.model.metadata import read_task_model_info
from pipeline.stages import metrics_file, start_name, target

log = logging.getLogger(__name__)


def params_sha256(p: Params) -> str:
    """Hash of the resolved params (every key, defaults included)."""
    return hashlib.sha256(json.dumps(p.model_dump(), sort_keys=True).encode()).hexdigest()


def _dvc_tags(params_path: Path, *stages: str) -> dict[str, str]:
    """The hashes their dvc.lock records of the stages' data (each in the pipeline that holds it)."""
    from pipeline import pipelines, presets, versioning

    owners = presets.owners(params_path) if versioning.is_dvc_project(params_path.parent) else {}
    found = [pipelines.stage_address(owners[s], s) for s in stages if s in owners]
    hashes = versioning.lock_hashes(params_path.parent, *filter(None, found))
    return {f"dvc.{path}": md5 for path, md5 in hashes.items()}


def _example(task_dir: Path, kind: str, rows: int = 3) -> list[dict]:
    """A few test inputs, as raw text, for the model's input example."""
    from components.data.tasks.folder import read_split

    test = read_split(task_dir, "test").slice(0, rows).to_pylist()
    if kind in ("token", "span"):
        return [{"text": " ".join(r["tokens"])} for r in test]
    columns = ("text_a", "text_b") if kind == "pair" else ("text",)
    return [{c: r[c] for c in columns} for r in test]


def publish(params_path: Path, tasks: list[str], parent_run_id: str | None = None,
            run_key: str | None = None, trigger: str = "pipeline") -> dict[str, dict]:
    """Register the encoder and the exported models of `tasks` that have been evaluated
    (attempts with one `run_key` share one MLflow run; `trigger` says who asked)."""
    from components.core import tracking
    from components.lifecycle import registry

    params_path = Path(params_path).resolve()
    root, p = params_path.parent, load_params(params_path)
    code = {**tracking.git_state(root), "bertflow.params_sha256": params_sha256(p)}
    encoder = target(p, root, "pretrain").out
    outcome: dict[str, dict] = {}
    with tracking.mlflow_run(p.tracking, root, "registry", parent_run_id=parent_run_id,
                             tags={"bertflow.stage": "registry", "bertflow.registry_trigger": trigger,
                                   **code}, key=run_key) as run:
        client = run.client
        encoder_version = None
        if (encoder / "bertflow.json").exists():
            pretrain = _stats(metrics_file(p, root, "pretrain"))
            tags = {**code, **_dvc_tags(params_path, "pretrain", "pairs", "tokenizer", "clean"),
                    "bertflow.mlm_accuracy": f"{pretrain.get('mlm_accuracy', float('nan')):.4f}"}
            done = registry.register_encoder(client, run, encoder, tags)
            encoder_version = done.version
            outcome[registry.ENCODER] = asdict(done)
        for task in tasks:
            first = p.finetune.init[0]  # the start whose task model is registered
            model_dir = target(p, root, f"evaluate@{task}").start_folder(first) / "model"
            stats = _stats(metrics_file(p, root, f"evaluate@{task}"))
            if not stats or not (model_dir / "bertflow.json").exists():
                log.info("registry: %s has no evaluated model yet, not registered", task)
                continue
            exported = read_task_model_info(model_dir).fit
            metric = stats["fits"][exported][stats["metric"]]
            init = exported.rsplit("-s", 1)[0]  # the arm the exported fit belongs to
            tags = {**code, **_dvc_tags(params_path, start_name(task, first), f"evaluate@{task}"),
                    "bertflow.task": task, "bertflow.kind": stats["kind"], "bertflow.fit": exported,
                    "bertflow.encoder_version": str(encoder_version or "none"),
                    "bertflow.metric_mean": f"{stats['primary'][init]['mean']:.6f}"}
            done = registry.register_task(client, run, task, stats["kind"], model_dir,
                                          _example(target(p, root, f"task_data@{task}").out, stats["kind"]),
                                          stats["metric"], metric, tags)
            outcome[task] = asdict(done)
            log.info("registry: %s: %s", task, done.reason)
        run.set_tags({f"registry.{name}": r["reason"] for name, r in outcome.items()})
    return outcome


def sync(params_path: Path) -> tuple[dict[str, dict], list[str]]:
    """`bertflow registry sync`: register the models this checkout holds (a clone's, after `dvc
    pull`) as the pipeline's registry step does, with their lineage; what is registered already
    (by content hash) is not registered again. (outcome per model, tasks with no model here)."""
    from pipeline import pipelines, presets, versioning

    params_path = Path(params_path).resolve()
    root, p = params_path.parent, load_params(params_path)
    tasks = list(p.finetune.tasks)
    if versioning.is_dvc_project(root):
        owners = presets.owners(params_path)
        first = p.finetune.init[0]
        names = ["pretrain", *(n for t in tasks for n in (start_name(t, first), f"evaluate@{t}"))]
        stages = [a for n in names if (a := pipelines.stage_address(owners[n], n))]
        # A model edited since dvc.lock would be registered with dvc.lock's lineage: refused.
        # A missing one is only left out (not pulled, or its task not run yet).
        modified = [path for path, how in versioning.changed_outs(root, *stages).items()
                    if how == "modified"]
        if modified:
            raise BertflowError(f"{', '.join(sorted(modified))}: differs from dvc.lock, so its lineage "
                                "is unknown: restore it (`dvc checkout --force`), or `bertflow run` and "
                                "commit dvc.lock, then sync")
    outcome = publish(params_path, tasks, trigger="registry sync")
    return outcome, [t for t in tasks if t not in outcome]


def _stats(path: Path) -> dict:
    return read_json(path) if path.exists() else {}
