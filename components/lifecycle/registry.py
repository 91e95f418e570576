"""The MLflow model registry: one registered model per task (and `encoder`), champion/challenger.

A new version gets alias `candidate`. It becomes `champion` only if its primary metric on the
task's test split (a version tag) beats the champion's; otherwise the champion stays. Every
change of champion is kept: on the registered model as the ordered list of champions
(`rollback` steps back through it), and on each version as tags saying when and why it was
promoted or demoted.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.errors import BertflowError
from components.lifecycle.rows import INPUTS

CANDIDATE, CHAMPION = "candidate", "champion"
HISTORY = "bertflow.champions"  # registered-model tag: JSON list of champion versions, oldest first
SHA = "bertflow.model_sha256"  # version tag: what was registered (a second run registers nothing)
METRIC, METRIC_NAME = "bertflow.metric", "bertflow.metric_name"
DECIDED = "bertflow.decision"  # version tag: the outcome of its challenge, set last
ENCODER = "encoder"
# What the pyfunc model needs at run time (the rest of the project is not imported by it).
RUNTIME = ("torch", "tokenizers", "safetensors", "numpy", "pandas", "pyarrow", "pyyaml", "mlflow",
           "onnxruntime")
CODE = Path(__file__).resolve().parents[1]  # the components package, shipped inside the model


def model_sha256(model_dir: Path) -> str:
    """Content hash of an exported model folder (every file, names included)."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        h.update(f.relative_to(model_dir).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def pip_requirements() -> list[str]:
    """RUNTIME pinned to the installed versions (explicit: inferring them takes ~15 s)."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in RUNTIME]


def signature(kind: str):
    """Input schema of a task kind: token and span tasks take `text` or `tokens`."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Array, ColSpec, Schema

    if kind in ("token", "span"):
        cols = [ColSpec("string", "text", required=False), ColSpec(Array("string"), "tokens", required=False)]
    else:
        cols = [ColSpec("string", name) for name in INPUTS[kind]]
    return ModelSignature(inputs=Schema(cols))


def save_pyfunc(model_dir: Path, kind: str, example: list[dict], out: Path) -> None:
    """The task's pyfunc model (code, not pickle) into `out`, with `model_dir` as its artifact."""
    import mlflow
    import pandas as pd

    mlflow.pyfunc.save_model(
        path=str(out), python_model=str(CODE / "lifecycle" / "pyfunc_model.py"),
        artifacts={"model": str(model_dir)}, code_paths=[str(CODE)],
        model_config={"backend": "torch"},  # saved, so that a load may name another
        signature=signature(kind), input_example=pd.DataFrame(example),
        pip_requirements=pip_requirements())


@dataclass
class Registered:
    """The outcome of registering one model."""

    name: str
    version: str  # the version holding this model
    new: bool  # registered now (False: an earlier version holds the same content)
    champion: str | None  # the champion version afterwards
    reason: str


def _versions(client, name: str) -> list:
    from mlflow.exceptions import MlflowException

    try:
        return client.search_model_versions(f"name='{name}'")
    except MlflowException:
        return []


def alias_version(client, name: str, alias: str):
    """The version an alias points at, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def history(client, name: str) -> list[str]:
    """Champion versions of `name`, oldest first (the current champion last)."""
    tags = client.get_registered_model(name).tags
    return json.loads(tags.get(HISTORY, "[]"))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def set_champion(client, name: str, version: str, reason: str, *, record: bool = True) -> None:
    """Point `champion` at `version`; tag the versions; append to the history if `record`."""
    old = alias_version(client, name, CHAMPION)
    if old is not None and str(old.version) != str(version):
        client.set_model_version_tag(name, str(old.version), "bertflow.demoted_at", _now())
    client.set_registered_model_alias(name, CHAMPION, str(version))
    client.set_model_version_tag(name, str(version), "bertflow.promoted_at", _now())
    client.set_model_version_tag(name, str(version), "bertflow.promotion_reason", reason)
    if record:
        client.set_registered_model_tag(name, HISTORY, json.dumps([*history(client, name), str(version)]))


def challenge(client, name: str, version: str, metric: float) -> tuple[str, str]:
    """Make `version` champion if its metric beats the champion's; (champion, reason)."""
    current = alias_version(client, name, CHAMPION)
    if current is None:
        set_champion(client, name, version, f"first model ({metric:.4f})")
        champion, reason = str(version), "first champion"
    elif metric > (best := float(current.tags.get(METRIC, "-inf"))):
        why = f"{metric:.4f} beats version {current.version} ({best:.4f})"
        set_champion(client, name, version, why)
        champion, reason = str(version), f"new champion: {why}"
    else:
        champion, reason = str(current.version), (f"stays candidate: {metric:.4f} does not beat "
                                                  f"champion {current.version} ({best:.4f})")
    client.set_model_version_tag(name, version, DECIDED, reason)
    return champion, reason


def unchanged(client, name: str, sha: str) -> Registered | None:
    """The outcome when a version of `name` already holds the model with this content hash.

    A version registered by an attempt that stopped before its challenge (killed, or a lost
    connection that Prefect retries) is finished now: made candidate and let challenge.
    """
    versions = _versions(client, name)
    match = next((v for v in versions if v.tags.get(SHA) == sha), None)
    if match is None:
        return None
    existing, tags = str(match.version), match.tags
    if METRIC in tags and DECIDED not in tags:
        if existing == str(max(int(v.version) for v in versions)):
            client.set_registered_model_alias(name, CANDIDATE, existing)
        champion, reason = challenge(client, name, existing, float(tags[METRIC]))
        return Registered(name, existing, False, champion, f"finished an interrupted registration: {reason}")
    champion = alias_version(client, name, CHAMPION)
    return Registered(name, existing, False, str(champion.version) if champion else None,
                      f"unchanged: version {existing} holds this model")


def register(client, run, name: str, folder: Path, artifact_path: str, sha: str,
             tags: dict[str, str], metric: float | None) -> Registered:
    """Log `folder` to `run`, register it as a new version of `name` with alias `candidate`,
    and with a metric, let it challenge the champion."""
    run.log_artifact(folder, artifact_path)
    all_tags = {**tags, SHA: sha}
    if metric is not None:
        all_tags[METRIC] = f"{metric:.6f}"
    version = str(run.register(artifact_path, name, CANDIDATE, all_tags))
    if metric is None:
        return Registered(name, version, True, None, "registered")
    champion, reason = challenge(client, name, version, metric)
    return Registered(name, version, True, champion, reason)


def register_task(client, run, task: str, kind: str, model_dir: Path, example: list[dict],
                  metric_name: str, metric: float, tags: dict[str, str]) -> Registered:
    """The task's exported model as a pyfunc version of registered model `task`."""
    sha = model_sha256(model_dir)
    if (same := unchanged(client, task, sha)) is not None:
        return same
    with tempfile.TemporaryDirectory(prefix="bertflow-pyfunc-") as tmp:
        save_pyfunc(model_dir, kind, example, Path(tmp) / "model")
        return register(client, run, task, Path(tmp) / "model", f"models/{task}", sha,
                        {**tags, METRIC_NAME: metric_name}, metric)


def register_encoder(client, run, encoder_dir: Path, tags: dict[str, str]) -> Registered:
    """The pretrained encoder folder (HF layout) as a version of registered model `encoder`."""
    sha = model_sha256(encoder_dir)
    return unchanged(client, ENCODER, sha) or register(client, run, ENCODER, encoder_dir, ENCODER,
                                                       sha, tags, None)


def promote(client, name: str, version: str) -> None:
    """Make `version` the champion by hand."""
    resolve(client, f"{name}/{version}")  # a clear error for an unknown model or version
    current = alias_version(client, name, CHAMPION)
    if current is None or str(current.version) != str(version):  # already champion: nothing to record
        set_champion(client, name, str(version), "promoted by hand")


def rollback(client, name: str) -> str:
    """Give `champion` back to the previous champion; returns its version."""
    past = history(client, _checked(client, name))
    if len(past) < 2:
        raise BertflowError(f"{name}: no previous champion to roll back to (history: {past or 'empty'})")
    current, previous = past[-1], past[-2]
    client.set_model_version_tag(name, current, "bertflow.rolled_back_at", _now())
    set_champion(client, name, previous, f"rollback from version {current}", record=False)
    client.set_registered_model_tag(name, HISTORY, json.dumps(past[:-1]))
    return previous


def _checked(client, name: str) -> str:
    """`name`, if the registry has a model of that name; else an error listing those it has."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        raise unknown_model(client, name) from None
    return name


def unknown_model(client, name: str) -> BertflowError:
    """The error for a model name the registry lacks, naming the ones it has."""
    names = sorted(m.name for m in client.search_registered_models())
    known = f"registered: {', '.join(names)}" if names else "the registry is empty: run `bertflow run` first"
    return BertflowError(f"no registered model {name!r} ({known})")


def _known_versions(client, name: str) -> str:
    """`name`'s versions and aliases, for an error message: "versions 1, 2; aliases champion -> 1"."""
    versions = sorted(int(v.version) for v in _versions(client, name))
    aliases = client.get_registered_model(name).aliases  # {alias: version}
    pointed = ", ".join(f"{a} -> {v}" for a, v in sorted(aliases.items())) or "none"
    return f"versions {', '.join(map(str, versions)) or 'none'}; aliases {pointed}"


def listing(client) -> list[dict[str, Any]]:
    """Every registered model: its number of versions, champion (and metric), candidate, history."""
    rows = []
    for model in client.search_registered_models():
        aliases = client.get_registered_model(model.name).aliases  # {alias: version}
        champion = alias_version(client, model.name, CHAMPION)
        rows.append({"name": model.name, "versions": len(_versions(client, model.name)),
                     CHAMPION: str(aliases.get(CHAMPION, "-")),
                     CANDIDATE: str(aliases.get(CANDIDATE, "-")),
                     "metric": champion.tags.get(METRIC_NAME, "") if champion else "",
                     "value": champion.tags.get(METRIC, "") if champion else "",
                     "history": json.loads(model.tags.get(HISTORY, "[]"))})
    return sorted(rows, key=lambda r: r["name"])


def resolve(client, ref: str):
    """`TASK@ALIAS`, `TASK/VERSION` or `TASK` (its champion) -> the model version; an unknown
    model, alias or version is a one-line error naming what the registry has instead."""
    from mlflow.exceptions import MlflowException

    name, at, alias = ref.partition("@")
    version = ""
    if not at:
        name, slash, version = ref.partition("/")
        alias = "" if slash else CHAMPION
    _checked(client, name)
    try:
        if alias:
            return client.get_model_version_by_alias(name, alias)
        return client.get_model_version(name, version)
    except MlflowException:
        what = f"alias {alias!r}" if alias else f"version {version or '(none given)'}"
        raise BertflowError(f"registered model {name!r} has no {what} "
                            f"({_known_versions(client, name)})") from None


def checked_uri(client, uri: str) -> str:
    """`uri`, after checking a registry URI (`models:/NAME@ALIAS`, `models:/NAME/VERSION`)
    against the registry; other URIs and paths are MLflow's to check."""
    prefix = "models:/"
    if uri.startswith(prefix):
        ref = uri[len(prefix):]
        if "@" in ref or ref.rpartition("/")[2].isdigit():
            resolve(client, ref)
    return uri


# Files whose loaders unpickle (torch.load, joblib, cloudpickle): a model of ours has none.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".joblib", ".pt", ".pth", ".ckpt", ".bin", ".cloudpickle")
# MLflow's own loaders of a models-from-code model (what save_pyfunc writes): they run the
# model's code file, and import nothing else of the folder's choosing.
CODE_LOADERS = ("mlflow.pyfunc.loaders.code_model", "mlflow.pyfunc.model")


def _flavors(model_dir: Path) -> dict | None:
    """The flavors an MLflow model folder's MLmodel names (python_function's a dict, empty if
    absent), or None if MLmodel is missing or unreadable."""
    import yaml

    try:
        flavors = yaml.safe_load((model_dir / "MLmodel").read_text(encoding="utf-8"))["flavors"]
        return {**flavors, "python_function": dict(flavors.get("python_function") or {})}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, UnicodeDecodeError, ValueError):
        return None


def pickles_in(model_dir: Path) -> list[str]:
    """What in an MLflow model folder would be unpickled, or run from a module it names, on
    loading: files of a pickle format, a flavor other than pyfunc's models-from-code (a pickled
    PythonModel, sklearn, torch...), a loader module other than MLflow's. [] for a model
    bertflow saved: code and safetensors."""
    model_dir = Path(model_dir)
    found = [str(p.relative_to(model_dir)) for p in sorted(model_dir.rglob("*"))
             if p.suffix.lower() in PICKLE_SUFFIXES and p.is_file()]
    flavors = _flavors(model_dir)
    if flavors is None:
        return [*found, "MLmodel (missing or unreadable)"]
    found += [f"flavor {name}" for name in flavors if name != "python_function"]
    pyfunc = flavors["python_function"]
    if (loader := pyfunc.get("loader_module")) not in (None, *CODE_LOADERS):
        found.append(f"loader_module {loader}")
    elif "model_code_path" not in pyfunc:  # MLflow's loader then unpickles the PythonModel
        found.append("python_function flavor without model code (a pickled model)")
    return found


def code_in(model_dir: Path) -> list[str]:
    """What in an MLflow model folder runs when MLflow loads it: its models-from-code file, the
    code folder it puts on sys.path, and what pickles_in finds; a model bertflow saved holds
    the first two (its own code, copied at registration)."""
    model_dir = Path(model_dir)
    pyfunc = (_flavors(model_dir) or {}).get("python_function", {})
    found = [f"model code {Path(str(pyfunc['model_code_path'])).name}"] if "model_code_path" in pyfunc else []
    found += [f"code folder {pyfunc['code']}"] if pyfunc.get("code") else []
    return found + pickles_in(model_dir)


def version_uri(client, name: str, ref: str = CHAMPION) -> str:
    """`models:/NAME/VERSION` of `name`'s version `ref` (an alias or a version number), checked."""
    version = resolve(client, f"{name}/{ref}" if ref.isdigit() else f"{name}@{ref}")
    return f"models:/{name}/{version.version}"


def _data_lines(tags: dict[str, str], indent: str) -> list[str]:
    # The data folders only: the metrics files of the stages are in git with the code.
    paths = sorted((k[len("dvc."):], v) for k, v in tags.items() if k.startswith("dvc.data/"))
    width = max((len(p) for p, _ in paths), default=0)
    return [f"{indent}{p:{width}s}  md5 {h}" for p, h in paths] or [f"{indent}(no dvc.lock hashes recorded)"]


def _code_line(tags: dict[str, str], indent: str) -> str:
    dirty = " (uncommitted changes)" if tags.get("git.dirty") == "true" else ""
    return (f"{indent}code: git {tags.get('git.commit', 'unknown')[:12]}{dirty}, "
            f"params sha256 {tags.get('bertflow.params_sha256', 'unknown')[:12]}")


def lineage(client, ref: str) -> list[str]:
    """The chain of a model version: its metric and code, the data it was trained and evaluated
    on, then the encoder version it started from and the data that encoder was trained on."""
    v = resolve(client, ref)
    tags = v.tags
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(v.creation_timestamp / 1000))
    lines = [f"{ref} = {v.name} version {v.version} (aliases: {', '.join(v.aliases) or 'none'}; "
             f"registered {when}; run {v.run_id})"]
    if METRIC in tags:
        lines.append(f"  test {tags.get(METRIC_NAME, 'metric')} {float(tags[METRIC]):.4f} "
                     f"(exported fit {tags.get('bertflow.fit', '?')}; mean over seeds "
                     f"{float(tags.get('bertflow.metric_mean', 'nan')):.4f})")
    lines.append(_code_line(tags, "  "))
    lines.append("  data (dvc.lock):")
    encoder = tags.get("bertflow.encoder_version", "none")
    own = {k: val for k, val in tags.items() if not (encoder != "none" and k == "dvc.data/models/encoder")}
    lines += _data_lines(own, "    ")
    if encoder == "none":
        return lines
    e = client.get_model_version(ENCODER, encoder)
    lines.append(f"  <- {ENCODER} version {e.version} (held-out MLM accuracy "
                 f"{e.tags.get('bertflow.mlm_accuracy', '?')}; run {e.run_id})")
    lines.append(_code_line(e.tags, "     "))
    lines.append("     data (dvc.lock): pretraining pairs <- tokenizer <- clean corpus <- raw")
    lines += _data_lines(e.tags, "       ")
    return lines
