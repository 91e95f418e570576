"""Champion/challenger rules of the registry on a real MLflow store (sqlite in a temp dir)."""

from __future__ import annotations

import json

import pytest

from components.core import tracking
from components.core.config import TrackingConfig
from components.core.errors import BertflowError
from components.lifecycle import registry
from tests.conftest import section


@pytest.fixture
def store(tmp_path):
    cfg = section(TrackingConfig, uri="sqlite:///mlflow.db", artifacts="mlartifacts", experiment="t")
    return cfg, tmp_path


def _register(store, folder, content: str, metric: float):
    """Register a folder holding `content` as a version of model `task` with `metric`."""
    cfg, root = store
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_text(content)
    with tracking.mlflow_run(cfg, root, "registry") as run:
        sha = registry.model_sha256(folder)
        return registry.unchanged(run.client, "task", sha) or registry.register(
            run.client, run, "task", folder, "model", sha, {"bertflow.metric_name": "accuracy"}, metric)


def test_a_version_becomes_champion_only_by_beating_it(store, tmp_path):
    client = tracking.client(*store)
    first = _register(store, tmp_path / "a", "a", 0.80)
    assert (first.version, first.new, first.champion) == ("1", True, "1")
    worse = _register(store, tmp_path / "b", "b", 0.70)
    tie = _register(store, tmp_path / "c", "c", 0.80)
    assert (worse.champion, tie.champion) == ("1", "1") and "does not beat" in tie.reason
    assert str(client.get_model_version_by_alias("task", "candidate").version) == "3"
    better = _register(store, tmp_path / "d", "d", 0.85)
    assert better.champion == "4" and "beats version 1" in better.reason
    assert registry.history(client, "task") == ["1", "4"]
    assert "bertflow.demoted_at" in client.get_model_version("task", "1").tags

    # The same content again registers nothing.
    again = _register(store, tmp_path / "d2", "d", 0.85)
    assert (again.version, again.new) == ("4", False) and "holds this model" in again.reason
    assert len(client.search_model_versions("name='task'")) == 4


def test_promote_and_rollback_walk_the_history(store, tmp_path):
    client = tracking.client(*store)
    for i, metric in enumerate([0.5, 0.6, 0.4]):
        _register(store, tmp_path / str(i), str(i), metric)
    registry.promote(client, "task", "3")
    registry.promote(client, "task", "3")  # already champion: not recorded twice
    assert registry.history(client, "task") == ["1", "2", "3"]
    assert registry.rollback(client, "task") == "2"
    assert registry.rollback(client, "task") == "1"
    assert str(client.get_model_version_by_alias("task", "champion").version) == "1"
    tags = client.get_model_version("task", "3").tags
    assert tags["bertflow.promotion_reason"] == "promoted by hand" and "bertflow.rolled_back_at" in tags
    with pytest.raises(BertflowError, match="no previous champion"):
        registry.rollback(client, "task")
    with pytest.raises(BertflowError, match="has no version 9"):
        registry.promote(client, "task", "9")
    with pytest.raises(BertflowError, match="no registered model 'other'"):
        registry.rollback(client, "other")
    rows = registry.listing(client)
    assert [(r["name"], r["versions"], r["champion"], r["candidate"]) for r in rows] == \
        [("task", 3, "1", "3")]
    assert json.loads(client.get_registered_model("task").tags[registry.HISTORY]) == ["1"]


def test_a_registration_interrupted_before_its_challenge_is_finished_not_repeated(store, tmp_path):
    cfg, root = store
    client = tracking.client(*store)
    _register(store, tmp_path / "a", "a", 0.80)
    # An attempt killed right after creating version 2 (before candidate and challenge).
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "weights.bin").write_text("b")
    sha = registry.model_sha256(folder)
    with tracking.mlflow_run(cfg, root, "registry") as run:
        run.log_artifact(folder, "model")
        source = f"{run.client.get_run(run.run_id).info.artifact_uri}/model"
        client.create_model_version("task", source, run_id=run.run_id,
                                    tags={registry.SHA: sha, registry.METRIC: "0.900000"})
    assert str(client.get_model_version_by_alias("task", "candidate").version) == "1"

    again = _register(store, tmp_path / "b2", "b", 0.90)  # the retry, or the next run
    assert (again.version, again.new, again.champion) == ("2", False, "2")
    assert again.reason.startswith("finished an interrupted registration: new champion")
    assert len(client.search_model_versions("name='task'")) == 2
    assert str(client.get_model_version_by_alias("task", "candidate").version) == "2"
    assert registry.history(client, "task") == ["1", "2"]
    settled = _register(store, tmp_path / "b3", "b", 0.90)  # decided now: nothing more to do
    assert settled.reason == "unchanged: version 2 holds this model"
