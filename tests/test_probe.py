"""The transfer probe: validation scores of an encoder on the probe tasks, the test split unread."""

from __future__ import annotations

import pytest

from components.core.config import FinetuneConfig
from components.core.errors import ConfigError
from components.data.tasks.prepare import prepare_task
from components.training.probe import PROBE, probe
from tests.conftest import section, task_config
from tests.test_finetune import _user_files

# The probe's task names, played by the small user files of test_finetune.
FAST = {"lr": 3e-3, "epochs": 2}
REVIEWS = task_config("classification", "user/reviews.csv", columns={"text": "review", "label": "verdict"},
                      **FAST)
TASKS = {
    "trec-6": REVIEWS,
    "movie-sentiment": REVIEWS,
    "conll2003-ner": task_config("token", "user/ner.conll", **FAST),
    "news-order": task_config("pair", "user/pairs.jsonl", **FAST),
}


@pytest.mark.slow
def test_the_probe_scores_validation_only_and_keeps_nothing(tiny_encoder, tmp_path):
    _user_files(tmp_path / "user")
    for name, task in TASKS.items():
        prepare_task(name, task, tmp_path, tmp_path / "packages", tmp_path / "tasks" / name)
        (tmp_path / "tasks" / name / "test.parquet").unlink()  # the probe must not need it
    cfg = section(FinetuneConfig, tasks=TASKS, batch_size=16, crf=False)
    scores = probe(tiny_encoder, TASKS, cfg, tmp_path / "tasks", tmp_path / "work", seeds=[1, 2])
    assert set(scores) == {*PROBE, "seeds", "mean", "mean_per_seed", "mean_std"}
    assert all(0 <= scores[name]["val_metric"] <= 1 and scores[name]["steps"] > 0 for name in PROBE)
    assert all(len(scores[name]["per_seed"]) == 2 for name in PROBE)
    assert scores["mean"] == pytest.approx(sum(scores[name]["val_metric"] for name in PROBE) / len(PROBE))
    seed2 = sum(scores[name]["per_seed"][1] for name in PROBE) / len(PROBE)
    assert scores["mean_per_seed"][1] == pytest.approx(seed2)
    assert scores["mean_std"] == pytest.approx(abs(scores["mean_per_seed"][0] - seed2) / 2 ** 0.5)
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").rglob("*.ckpt"))
    with pytest.raises(ConfigError, match="finetune.tasks lacks news-order"):
        probe(tiny_encoder, {k: v for k, v in TASKS.items() if k != "news-order"}, cfg, tmp_path / "tasks",
              tmp_path / "work")
