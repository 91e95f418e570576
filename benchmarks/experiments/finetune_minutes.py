"""Where a finished run's fine-tuning minutes go, per (task, start): the stage's wall minutes, the
rate search's trials and the other seeds' fits (worker minutes); the steps each fit trained and
the share trained after its best validation pass (what early stopping's patience costs). Read
from the project's MLflow runs (minutes) and its fits' records (steps, validation histories):
nothing is trained.

Usage:  python -m benchmarks.experiments.finetune_minutes [--project DIR]   (DIR ran `make run`)
Writes the "Fine-tuning minutes" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.exported import project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.core.tracking import client, experiment_id
from components.evaluation.tables import markdown

SECTION = "## Fine-tuning minutes"


def stage_minutes(project: Path) -> dict[str, dict[str, float]]:
    """The latest finetune@ run's `this_run` metrics per stage name, in minutes."""
    p = load_params(project / "params.yaml")
    c = client(p.tracking, project)
    runs = c.search_runs([experiment_id(p.tracking, project)], "attributes.run_name LIKE 'finetune@%'",
                         order_by=["attributes.start_time ASC"])
    latest: dict[str, dict[str, float]] = {}
    for run in runs:  # later runs of one stage replace earlier ones
        metrics = run.data.metrics
        if "this_run.seconds" in metrics:
            latest[run.info.run_name] = {k.removeprefix("this_run."): v for k, v in metrics.items()
                                         if k.startswith("this_run.")}
    return latest


def after_best(history: list[dict], steps: int) -> float:
    """The share of a fit's steps trained after its best validation pass."""
    if not history or not steps:
        return 0.0
    best = max(history, key=lambda h: h["val_metric"])  # the first on a tie, as the checkpoint
    return (steps - best["step"]) / steps


def rows(project: Path) -> list[list[str]]:
    """A table row per (task, start) the run fine-tuned."""
    p = load_params(project / "params.yaml")
    minutes, out = stage_minutes(project), []
    for task in p.finetune.tasks:
        for init in p.finetune.init:
            m = minutes.get(f"finetune@{task}-{init}")
            fits_dir = project / p.paths.models / "tasks" / task / init / "fits"
            if m is None or not fits_dir.exists():
                continue
            fits = [json.loads(f.read_text()) for f in sorted(fits_dir.glob(f"{init}-s*.json"))
                    if f.stem.rpartition("-s")[2].isdigit()]  # not the search's record
            search = sum(v for k, v in m.items() if k.startswith("search."))
            # the first seed's fit is the search's winning trial, restored: its minutes are the trial's
            fitting = sum(v for k, v in m.items() if k.endswith(".minutes") and not k.startswith("search.")
                          and not (search and k == f"{init}-s{p.finetune.seeds[0]}.minutes"))
            total = m["seconds"] / 60
            steps = [f["steps"] for f in fits]
            waste = [after_best(f["history"], f["steps"]) for f in fits]
            out.append([task, init, f"{total:.1f}", f"{search:.1f}", f"{fitting:.1f}",
                        f"{m.get('workers', 1):.0f}", f"{sum(steps) / len(steps):,.0f}",
                        f"{sum(waste) / len(waste):.0%}"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    project_option(parser)
    args = parser.parse_args()
    table = rows(args.project)
    header = ["task", "start", "stage min", "search min", "fits min", "workers",
              "steps a fit", "steps after best"]
    total = [sum(float(r[i]) for r in table) for i in (2, 3, 4)]
    lines = markdown(header, [*table, ["**all**", "", f"**{total[0]:.1f}**", f"{total[1]:.1f}",
                                       f"{total[2]:.1f}", "", "", ""]]).splitlines()
    text = "\n".join([
        SECTION, "", measured(), "",
        "Reproduce: `python -m benchmarks.experiments.finetune_minutes --project DIR`, DIR a project "
        "after `make run`.",
        "",
        "Wall minutes of each fine-tuning stage (its MLflow run); the worker minutes of its rate "
        "search's trials and of the fits of the seeds after the first (whose fit is the search's "
        "winning trial, restored); side by side in `workers` processes they overlap, so they can "
        "add up to more than the stage. Each fit's steps and the share of them trained after its "
        "best validation pass (early stopping's patience), mean over seeds.",
        "", *lines, ""])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
