"""The transfer table: scores per task and init over seeds, the gain of pretraining, verdicts,
the steps each start cost, and several pipeline runs' tables side by side (Markdown for people)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NO_VALUE = "—"  # table cell when there is nothing to compare against


def summarize(values: Sequence[float]) -> dict:
    """Mean and sample std (ddof=1; 0 for a single value) of a metric over seeds."""
    if not len(values):
        raise ValueError("nothing to summarize")
    array = np.asarray(values, dtype=float)
    return {
        "mean": float(array.mean()),
        "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
        "n": len(array),
        "values": [float(v) for v in array],
    }


def _outcome(better: dict, worse: dict, margin: float = 0.0) -> str:
    """'helps' if the mean gain exceeds the larger seed std plus `margin`, 'hurts' if the loss
    does, else 'within seed spread'."""
    gain = better["mean"] - worse["mean"]
    spread = max(better["std"], worse["std"]) + margin
    return "helps" if gain > spread else "hurts" if -gain > spread else "within seed spread"


UNMEASURED = "†"  # marks a verdict judged on the seed spread alone: no encoder spread measured


def verdict(pretrained: dict, scratch: dict | None, encoder_spread: float | None = None) -> str:
    """Whether the pretrained-minus-scratch gain exceeds the seed spread of either side plus the
    task's encoder spread (points: how far its pretrained score moved between two pretraining
    seeds of the recipe); without one, the seed spread alone, marked †."""
    if scratch is None:
        return NO_VALUE
    outcome = _outcome(pretrained, scratch, (encoder_spread or 0.0) / 100)
    if outcome != "within seed spread":
        text = f"pretraining {outcome}"
    else:
        text = outcome if encoder_spread is None else "within both spreads"
    if encoder_spread is None:
        text += UNMEASURED
    if min(pretrained["n"], scratch["n"]) < 2:  # std 0 by convention, not measured
        text += " (single seed: spread unknown)"
    return text


def verdicts(row: dict) -> str:
    """The verdict on pretraining; with a checkpoint arm, also on what continued pretraining
    added to the checkpoint as is; with an adapted arm, on what task adaptation added."""
    text = verdict(row["pretrained"], row.get("scratch"), row.get("encoder_spread"))
    if row.get("checkpoint"):
        text += f"; continued pretraining {_outcome(row['pretrained'], row['checkpoint'])}"
    if row.get("adapted"):
        text += f"; task adaptation {_outcome(row['adapted'], row['pretrained'])}"
    if row.get("distilled"):
        text += f"; distillation {_outcome(row['distilled'], row['pretrained'])}"
    return text


def _pct(summary: dict) -> str:
    return f"{100 * summary['mean']:.1f} ± {100 * summary['std']:.1f}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")  # a pipe in a task name would split the row


ARMS = {"pretrained": "pretrained", "distilled": "distilled", "teacher": "teacher",
        "adapted": "task-adapted", "checkpoint": "checkpoint as is", "scratch": "from scratch"}
# Difference columns: (title, minuend, subtrahend), shown when both arms were measured.
GAINS = (("gain", "pretrained", "scratch"), ("vs checkpoint", "pretrained", "checkpoint"),
         ("adaptation", "adapted", "pretrained"), ("distillation", "distilled", "pretrained"))


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown pipe table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def transfer_table(rows: list[dict]) -> str:
    """The transfer table in Markdown (see `transfer_cells`)."""
    return markdown(*transfer_cells(rows))


def _arms(rows: list[dict]) -> list[str]:
    """The inits any of the rows measured, in `ARMS` order."""
    return [a for a in ARMS if any(row.get(a) for row in rows)]


def transfer_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells per task: each init's score (`ARMS` order; pretrained always), the
    differences of `GAINS` (pretraining over scratch, continued pretraining over the checkpoint,
    task adaptation over the pretrained start), each init's learning rate (same order), the
    task's baseline (TF-IDF + LR, most frequent tag), and a verdict."""
    arms = _arms(rows)
    gains = [(title, a, b) for title, a, b in GAINS if a in arms and b in arms]
    kept = "distilled" in arms and "teacher" in arms  # the student's score as a share of its teacher's
    header = ["task", "kind", "metric", *(ARMS[a] for a in arms), *(g for g, _, _ in gains),
              *(["of teacher"] if kept else []), "lr", "baseline", "verdict"]
    cells = []
    for row in rows:
        baseline, lrs = row.get("baseline"), row.get("lr", {})
        cells.append([row["task"], row["kind"], row["metric"],
                      *(_pct(row[a]) if row.get(a) else NO_VALUE for a in arms),
                      *(f"{100 * (row[a]['mean'] - row[b]['mean']):+.1f}" if row.get(a) and row.get(b)
                        else NO_VALUE for _, a, b in gains),
                      *([f"{100 * row['distilled']['mean'] / row['teacher']['mean']:.0f}%"
                         if row.get("distilled") and row.get("teacher") and row["teacher"]["mean"]
                         else NO_VALUE] if kept else []),
                      " / ".join(f"{lrs[a]:g}" for a in arms if a in lrs) or NO_VALUE,
                      NO_VALUE if baseline is None else f"{100 * baseline:.1f}",
                      verdicts(row)])
    return header, cells


def fits_by_init(fits: dict[str, dict]) -> dict[str, list[dict]]:
    """Each init's fits (named INIT-sSEED) of a task's evaluate stats (`fits`)."""
    by_init: dict[str, list[dict]] = {}
    for fit, stats in fits.items():
        by_init.setdefault(fit.rsplit("-s", 1)[0], []).append(stats)
    return dict(sorted(by_init.items()))


def arm_steps(by_init: dict[str, list[dict]]) -> dict[str, dict]:
    """Optimizer steps of one fit, per init over its seeds (`fits_by_init`). Steps, not wall
    minutes: the table must read the same on every machine that trains the same models."""
    return {init: summarize([f["steps"] for f in fits]) for init, fits in by_init.items()}


def arm_lr(by_init: dict[str, list[dict]]) -> dict[str, float]:
    """The peak learning rate each init's fits trained with (set, or chosen by the search)."""
    return {init: fits[0]["lr"] for init, fits in by_init.items() if "lr" in fits[0]}


def cost_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells per task: the steps one fit of each init took (early stopping ends
    it), mean ± std over seeds; pretraining, paid once for all tasks, is in the pretrain
    stage's stats."""
    arms = _arms(rows)
    cells = [[row["task"], *(f"{m['mean']:,.0f} ± {m['std']:,.0f}" if (m := row["steps"].get(a))
                             else NO_VALUE for a in arms)]
             for row in rows if row.get("steps")]
    return ["task", *(ARMS[a] for a in arms)], cells


def compare_transfer(runs: dict[str, dict]) -> str:
    """Markdown table of several pipeline runs' transfer.json side by side: a column per run and init
    (`LABEL init`), tasks in the first run's order; the arms of runs with other encoders, e.g.
    the default encoder and a continued checkpoint, read as one table."""
    columns = [(label, arm) for label, table in runs.items() for arm in ARMS
               if any(t.get(arm) for t in table.values())]
    header = ["task", "metric", *(f"{label} {ARMS[arm]}" for label, arm in columns)]
    cells = []
    for task in dict.fromkeys(task for table in runs.values() for task in table):
        first = next(table[task] for table in runs.values() if task in table)
        cells.append([task, first["metric"], *(_pct(runs[label][task][arm])
                                               if runs[label].get(task, {}).get(arm) else NO_VALUE
                                               for label, arm in columns)])
    return markdown(header, cells)
