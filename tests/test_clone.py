"""A real small project that travels (one task, tiny model, run once by `bertflow run`):

- copied: the copy's commands refuse its mlflow.db (which names the old folder) in one line,
  `bertflow tracking relocate` points it at the copy, and then the copy predicts and writes
  artifacts of its own while the original's files stay as they were;
- cloned: committed (dvc.lock, metrics) and pushed, a `git clone` with `dvc pull` and
  `bertflow registry sync` has the same champions (by content hash) and predictions.

The tests share one project and run in file order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_task_project, run_cli
from tests.test_relocate import snapshot

pytestmark = pytest.mark.slow
TASKS = {"reviews": {"kind": "classification", "source": "data/user/tasks/reviews.csv",
                     "columns": {"text": "review", "label": "verdict"}}}
TEXTS = ["the film number 7 was great", "the film number 8 was awful", "a film"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The project, run through the registry step; its models only need to be the same models
    in every copy, so pretraining and fine-tuning are as short as they go."""
    repo = make_task_project(tmp_path_factory.mktemp("travel") / "project", TASKS)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["pretrain"].update(max_steps=4, warmup_steps=1, val_every_steps=2, snapshot_every_steps=2,
                              short_seq_steps=2)
    params["finetune"].update(epochs=1, evals_per_epoch=1)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run_cli("git", "commit", "-qam", "short runs", cwd=repo)
    run_cli("bertflow", "run", cwd=repo)
    return repo


@pytest.fixture(scope="module")
def answers(project) -> str:
    """The project's predictions on TEXTS, which every copy and clone must repeat."""
    return _predict(project)


def _predict(repo: Path) -> str:
    texts = [a for t in TEXTS for a in ("--text", t)]
    return run_cli("bertflow", "predict", "reviews", *texts, cwd=repo).stdout


def _registered(repo: Path) -> dict[str, dict[str, str]]:
    """Per model: the content hash and the DVC lineage of its champion (the encoder: its
    latest version, which is not challenged)."""
    from components.core import tracking
    from components.core.config import load_params
    from components.lifecycle import registry

    client = tracking.client(load_params(repo / "params.yaml").tracking, repo)
    out = {}
    for name, alias in (("encoder", registry.CANDIDATE), ("reviews", registry.CHAMPION)):
        tags = client.get_model_version_by_alias(name, alias).tags
        out[name] = {k: v for k, v in tags.items() if k == registry.SHA or k.startswith("dvc.")}
    return out


def test_a_copy_refuses_the_old_store_until_relocated_and_then_uses_only_its_own(project, answers, tmp_path):
    before = {name: snapshot(project / name) for name in ("mlartifacts", "data")}
    db_before = snapshot(project)["mlflow.db"]
    copy = tmp_path / "copy"
    shutil.copytree(project, copy, symlinks=True)

    for command in (["registry", "list"], ["predict", "reviews", "--text", TEXTS[0]]):
        refused = run_cli("bertflow", *command, cwd=copy, check=False)
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert (project / "mlartifacts").as_uri() in refused.stderr
        assert "bertflow tracking relocate" in refused.stderr

    moved = run_cli("bertflow", "tracking", "relocate", cwd=copy).stdout
    assert moved.startswith(f"{project} -> {copy}: ") and "model_versions.source" in moved
    assert _predict(copy) == answers
    listing = run_cli("bertflow", "registry", "list", cwd=copy).stdout
    assert any(line.split()[:3] == ["reviews", "1", "1"] for line in listing.splitlines())
    # A stage logs its artifacts into the copy's folder.
    artifacts = set((copy / "mlartifacts").iterdir())
    run_cli("bertflow", "stage", "transfer", cwd=copy)
    (new_run,) = set((copy / "mlartifacts").iterdir()) - artifacts
    assert any(p.is_file() for p in new_run.rglob("transfer.md"))

    assert {name: snapshot(project / name) for name in before} == before
    assert snapshot(project)["mlflow.db"] == db_before


def test_a_clone_with_dvc_pull_and_registry_sync_has_the_same_champions_and_predictions(project, answers,
                                                                                       tmp_path):
    # What a user commits after `make run`: dvc.lock (the data versions a clone pulls) and
    # metrics/ (stats files DVC keeps in git, not in the remote).
    run_cli("git", "add", "dvc.lock", "metrics", cwd=project)
    run_cli("git", "commit", "-qm", "results", cwd=project)
    run_cli("dvc", "push", cwd=project)
    clone = tmp_path / "clone"
    run_cli("git", "clone", "-q", str(project), str(clone), cwd=tmp_path)
    run_cli("dvc", "remote", "modify", "--local", "local", "url", str(project / ".dvc-storage"), cwd=clone)
    run_cli("dvc", "pull", cwd=clone)

    synced = run_cli("bertflow", "registry", "sync", cwd=clone).stdout
    assert "encoder: version 1" in synced and "reviews: version 1, champion 1: first champion" in synced
    assert _registered(clone) == _registered(project)
    assert _predict(clone) == answers

    # A model folder that is not dvc.lock's would get dvc.lock's lineage: refused, by name.
    with (clone / "data/models/tasks/reviews/model/bertflow.json").open("a") as f:
        f.write(" ")
    refused = run_cli("bertflow", "registry", "sync", cwd=clone, check=False)
    assert refused.returncode == 1 and "data/models/tasks/reviews: differs from dvc.lock" in refused.stderr
    run_cli("dvc", "checkout", "--force", cwd=clone)
    # Idempotent: a second sync registers nothing (versions are found by content hash).
    again = run_cli("bertflow", "registry", "sync", cwd=clone).stdout
    assert again.splitlines() == ["encoder: version 1: unchanged: version 1 holds this model",
                                  "reviews: version 1, champion 1: unchanged: version 1 holds this model"]
