"""Stage `evaluate@task`: score every fit of a task (each start's) on its test split, the task's baseline
(TF-IDF + LR for texts, the most frequent tag for token tasks), a warning when the exported arm
ends below it, and plots (validation curves of all fits; confusion and per-class F1 of the
exported fit)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from components.data.tasks.folder import read_meta, read_split
from components.evaluation.baseline import MOST_FREQUENT_TAG, TFIDF, most_frequent_tag, tfidf_baseline
from components.evaluation.metrics import classification_metrics, primary_metric, score_predictions
from components.evaluation.plots import write_confusion, write_curves, write_per_class
from components.evaluation.tables import summarize
from components.model.metadata import INFO_FILE, read_encoder_info, read_task_model_info

if TYPE_CHECKING:
    from components.core.config import EvaluateConfig, TaskConfig

log = logging.getLogger(__name__)


def _floats(metrics: dict) -> dict[str, float]:
    """The scalar scores of a metrics dict (not the tables: per class, confusion)."""
    return {k: v for k, v in metrics.items() if isinstance(v, float)}


def _texts(table: pa.Table, kind: str) -> list[str]:
    if kind == "pair":
        return [f"{a} [SEP] {b}" for a, b in zip(table["text_a"].to_pylist(), table["text_b"].to_pylist(),
                                                   strict=True)]
    return table["text"].to_pylist()


def evaluate_task(name: str, task: TaskConfig, cfg: EvaluateConfig, task_dir: Path, starts: dict[str, Path],
                  encoder_dir: Path, out_dir: Path) -> dict:
    """Score every fit of a task on its test split: the fits of each start's folder (`starts`,
    by start, the first's task model the exported one); the per-start summary over seeds, each
    fit's steps and rate, the encoder's pretraining budget, the baseline, and plots (curves of
    all fits; confusion and per-class F1 of the exported fit) into out_dir."""
    import pyarrow.parquet as pq

    meta = read_meta(task_dir)
    test = read_split(task_dir, "test")
    files = {p.stem: p for folder in starts.values() for p in (Path(folder) / "fits").glob("*.parquet")}
    for init, folder in starts.items():
        if not any(n.rsplit("-s", 1)[0] == init for n in files):
            raise FileNotFoundError(f"{Path(folder) / 'fits'}: no fine-tuning fits of the {init} start; "
                                    "run its stage first")
    scheme = meta.get("scheme", "")
    metric = primary_metric(task.kind, scheme)
    fits, histories, records = {}, {}, {}
    for fit in sorted(files):
        predictions = pq.read_table(files[fit])
        fits[fit] = score_predictions(task.kind, meta["labels"], test, predictions, scheme)
        records[fit] = json.loads(files[fit].with_suffix(".json").read_text())
        histories[fit] = records[fit]["history"]
    by_init: dict[str, list[float]] = {}
    for fit, m in fits.items():
        by_init.setdefault(fit.rsplit("-s", 1)[0], []).append(m[metric])
    # The encoder's budget: the transfer table flags a pretraining a time guard cut short.
    encoder = read_encoder_info(encoder_dir).stats
    stats = {"kind": task.kind, "metric": metric, "test_examples": test.num_rows,
             **({"scheme": scheme} if scheme else {}),
             "primary": {init: summarize(values) for init, values in sorted(by_init.items())},
             "fits": {fit: {**_floats(m), "steps": records[fit]["steps"], "lr": records[fit]["lr"]}
                      for fit, m in fits.items()},
             "encoder": {k: encoder[k] for k in ("steps", "max_steps", "stopped_by") if k in encoder},
             "baseline": None}
    train = read_split(task_dir, "train")
    if cfg.tfidf_baseline and task.kind in ("classification", "pair"):
        predicted = tfidf_baseline(_texts(train, task.kind), train["label"].to_pylist(),
                                   _texts(test, task.kind), seed=0)
        tfidf = classification_metrics(test["label"].to_pylist(), predicted, meta["labels"])
        stats["baseline"] = {"name": TFIDF, **{k: tfidf[k] for k in ("accuracy", "macro_f1", "mcc")}}
    if task.kind == "token":
        tags = most_frequent_tag(train["tokens"].to_pylist(), train["tags"].to_pylist(),
                                 test["tokens"].to_pylist())
        found = score_predictions(task.kind, meta["labels"], test, pa.table({"pred_tags": tags}), scheme)
        stats["baseline"] = {"name": MOST_FREQUENT_TAG, **_floats(found)}
    exported = Path(next(iter(starts.values()))) / "model"  # plots describe the exported fit
    first = read_task_model_info(exported).fit if (exported / INFO_FILE).exists() else min(files)
    arm, baseline = first.rsplit("-s", 1)[0], stats["baseline"]
    if baseline and metric in baseline and stats["primary"][arm]["mean"] < baseline[metric]:
        stats["warning"] = (f"the {arm} fits ({metric} {stats['primary'][arm]['mean']:.4f}) end below "
                            f"the {baseline['name']} baseline ({baseline[metric]:.4f})")
        log.warning("evaluate %s: %s", name, stats["warning"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_curves(histories, out_dir / "curves.png", out_dir / "curves.csv")
    write_per_class(fits[first]["per_class"], out_dir / "per_class.png", out_dir / "per_class.csv")
    if "confusion" in fits[first]:
        write_confusion(fits[first], out_dir / "confusion.png", out_dir / "confusion.csv")
    return stats
