"""Stage `transfer`: what pretraining bought, per task: the transfer table over every task's
evaluate stats, as Markdown for people and JSON for tools."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from components.core.io import atomic_file
from components.evaluation.baseline import MOST_FREQUENT_TAG, TFIDF
from components.evaluation.tables import (
    UNMEASURED,
    arm_lr,
    arm_steps,
    cost_cells,
    fits_by_init,
    markdown,
    summarize,
    transfer_table,
    verdicts,
)


def guard_warning(tasks_dir: Path, tasks: Sequence[str]) -> str:
    """A loud line when the encoder the tasks were fine-tuned from stopped on a time guard
    (pretrain.max_minutes) before pretrain.max_steps: such a table is not a reference."""
    for name in tasks:
        path = Path(tasks_dir) / name / "evaluate_stats.json"
        encoder = json.loads(path.read_text()).get("encoder", {}) if path.exists() else {}
        if encoder.get("stopped_by") == "max_minutes":
            return (f"**Warning: pretraining was cut short by `pretrain.max_minutes` at step "
                    f"{encoder['steps']:,} of {encoder['max_steps']:,}.** The encoder depends on "
                    "the speed of the machine that trained it; do not take this table for a "
                    "reference.\n\n")
    return ""


def teacher_scores(task_metrics: Path) -> dict | None:
    """The `distilled` start's teacher on the test split over its seeds (teacher_stats.json),
    or None without a teacher."""
    path = Path(task_metrics) / "teacher_stats.json"
    stats = json.loads(path.read_text()) if path.exists() else {}
    return summarize([s["test"] for s in stats["scores"].values()]) if stats.get("teacher") else None


def _baseline_legend(rows: list[dict]) -> str:
    """What the baseline column holds, for the baselines the rows have, trained on the same
    train split."""
    kinds = {TFIDF: "TF-IDF + logistic regression (text tasks)",
             MOST_FREQUENT_TAG: "each word's most frequent tag in train (token tasks)"}
    found = [text for name, text in kinds.items() if any(r["baseline_name"] == name for r in rows)]
    return f" *baseline*: {' or '.join(found)}, on the same splits." if found else ""


def transfer_report(tasks: Sequence[str], tasks_dir: Path, md_path: Path, json_path: Path,
                    init_from: str = "", student_layers: Sequence[int] = (), teacher: str = "",
                    encoder_spread: Mapping[str, float] | None = None) -> dict:
    """The transfer table over the tasks' evaluate stats: Markdown for people, JSON for tools.
    `student_layers` and `teacher` (distill's) say what the `distilled` start's student was;
    `encoder_spread` (points, per task) what a verdict on pretraining must clear beyond the seeds'."""
    encoder_spread = encoder_spread or {}
    rows = []
    for name in tasks:
        path = Path(tasks_dir) / name / "evaluate_stats.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: task {name} is not evaluated; run evaluate@{name} first")
        s = json.loads(path.read_text())
        fits = fits_by_init(s["fits"])
        baseline = s.get("baseline")
        rows.append({"task": name, "kind": s["kind"], "metric": s["metric"],
                     "baseline": baseline[s["metric"]] if baseline else None,
                     "baseline_name": baseline["name"] if baseline else None,
                     "scratch": None, **s["primary"], "teacher": teacher_scores(Path(tasks_dir) / name),
                     "steps": arm_steps(fits), "lr": arm_lr(fits),
                     "encoder_spread": encoder_spread.get(name)})
    seeds = max((r["pretrained"]["n"] for r in rows), default=0)
    encoder = (f"continued pretraining of {init_from} on the corpus" if init_from
               else "pretrained here from random weights")
    legend = f"*pretrained*: the pretrain stage's encoder ({encoder}); "
    if any(r.get("checkpoint") for r in rows):
        legend += (f"*checkpoint as is*: {init_from} fine-tuned without continued pretraining; "
                   "*vs checkpoint*: pretrained minus checkpoint as is, in points, and "
                   "*continued pretraining helps* when it exceeds the larger seed std; ")
    if any(r.get("distilled") for r in rows):
        student = (f"layers {', '.join(map(str, student_layers))} of {teacher}, the teacher's "
                   "checkpoint, with its embeddings and tokenizer," if student_layers
                   else "the pretrained encoder")
        legend += (f"*distilled*: {student} fine-tuned on its *teacher*'s soft targets "
                   "over the training split and its augmented copies (teacher_stats.json, "
                   "transfer_set_stats.json); *distillation*: distilled minus pretrained, in points; "
                   "*of teacher*: the distilled score as a share of the teacher's; ")
    if any(r.get("adapted") for r in rows):
        legend += ("*task-adapted*: the pretrained encoder continued with masked LM on the task's "
                   "own training text before fine-tuning (adapt_stats.json); *adaptation*: "
                   "task-adapted minus pretrained, in points, and *task adaptation helps* when it "
                   "exceeds the larger seed std; ")
    text = ("# What pretraining bought\n\n" + guard_warning(tasks_dir, tasks)
            + f"Test-split scores, mean ± sample std over {seeds} seeds, in percent. {legend}"
            "*gain*: pretrained minus from scratch, in points; *pretraining helps* when the gain "
            "exceeds the larger seed std plus the task's encoder spread (how far its pretrained score "
            "moved on validation between two pretraining seeds of the recipe, evaluate.encoder_spread); "
            f"{UNMEASURED}: no encoder spread measured, the seed std alone; "
            "*lr*: each start's peak learning rate, in column order "
            f"(chosen on validation when a rate grid is set).{_baseline_legend(rows)}\n\n"
            + transfer_table(rows))
    cost = cost_cells(rows)
    adapt_cost = (", a task-adapted start's continued pretraining in adapt_stats.json"
                  if any(r.get("adapted") for r in rows) else "")
    if cost[1]:
        text += ("\n## What each start cost\n\nOptimizer steps of one fit (one init, one seed; "
                 "mean ± std over seeds) until early stopping or the last epoch; pretraining, paid "
                 f"once for every task, is in pretrain_stats.json{adapt_cost}; a learning-rate "
                 "search adds, per start, a first-seed trial for every further rate "
                 "(the start's stats, `search`). Wall minutes are in each finetune run's MLflow "
                 "metrics (`this_run.*`).\n\n"
                 + markdown(*cost))
    with atomic_file(md_path) as tmp:
        tmp.write_text(text)
    summary = {r["task"]: {**{k: v for k, v in r.items() if k != "task"},
                           "verdict": verdicts(r)} for r in rows}
    with atomic_file(json_path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return {name: {"gain": r["pretrained"]["mean"] - r["scratch"]["mean"]} if r["scratch"] else {}
            for name, r in zip(tasks, rows, strict=True)}
