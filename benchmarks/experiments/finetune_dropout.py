"""Fine-tuning without dropout against a finished run's fits (its model.dropout): what dropout,
25-30% of a fine-tuning step's forward and backward on CPU, buys on validation.

Each task's starts are fitted again from the run's encoder with its exported dropout set to 0
(ModernBERT's own fine-tuning default), at the rate each start's search chose in the run and its
seeds, with the run's workers; validation scores only (the test splits are not read). A gain
or loss counts only beyond the larger seed std of the two and the task's encoder spread.

Usage:  python -m benchmarks.experiments.finetune_dropout [--project DIR] [--task NAME ...]
DIR ran `make run`. Writes the "Fine-tuning without dropout" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.exported import project_option
from benchmarks.results import measured, write_section
from components.core.params import load_params
from components.evaluation.tables import markdown
from components.training.finetune import finetune_start

SECTION = "## Fine-tuning without dropout"


def without_dropout(encoder: Path, out: Path) -> float:
    """Copy the exported `encoder` to `out` with its recorded fine-tuning dropout set to 0; the
    dropout the run fitted with."""
    shutil.copytree(encoder, out)
    info = json.loads((out / "bertflow.json").read_text())
    ran = info["config"]["dropout"]
    info["config"]["dropout"] = 0.0
    (out / "bertflow.json").write_text(json.dumps(info, indent=2))
    return ran


def points(fits: dict) -> list[float]:
    return [100 * fit["best_val_metric"] for fit in fits.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    project_option(parser)
    parser.add_argument("--task", action="append", help="a task (default: every task)")
    args = parser.parse_args()
    project = args.project
    p = load_params(project / "params.yaml")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        encoder = Path(tmp) / "encoder"
        ran_dropout = without_dropout(project / p.paths.models / "encoder", encoder)
        for name in args.task or list(p.finetune.tasks):
            for init in ("pretrained", "scratch"):
                ran = json.loads((project / p.paths.metrics / "tasks" / name /
                                  f"finetune-{init}_stats.json").read_text())
                rate = next(iter(ran["fits"].values()))["lr"]
                task = p.finetune.tasks[name].model_copy(update={"lr": [rate]})
                start = time.perf_counter()
                stats = finetune_start(name, task, p.finetune, init=init,
                                       task_dir=project / p.paths.tasks / name, encoder_dir=encoder,
                                       out_dir=Path(tmp) / name / init)
                minutes = (time.perf_counter() - start) / 60
                new, old = points(stats["fits"]), points(ran["fits"])
                margin = max(statistics.stdev(new), statistics.stdev(old)) + \
                    p.evaluate.encoder_spread.get(name, 0.0)
                gain = statistics.mean(new) - statistics.mean(old)
                verdict = "within spread" if abs(gain) <= margin else ("better" if gain > 0 else "worse")
                rows.append([name, init, f"{rate:g}",
                             f"{statistics.mean(old):.1f} ± {statistics.stdev(old):.1f}",
                             f"{statistics.mean(new):.1f} ± {statistics.stdev(new):.1f}",
                             f"{gain:+.1f}", f"{margin:.1f}", verdict, f"{minutes:.1f}"])
                print(" | ".join(rows[-1]), flush=True)
    write_section("\n".join([
        SECTION, "", measured(), "",
        "Reproduce: `python -m benchmarks.experiments.finetune_dropout --project DIR` (DIR after "
        "`make run`; validation only).", "",
        "Each start's fits (its seeds, at the rate the run's search chose) from the run's encoder "
        f"with dropout {ran_dropout:g} (the run's) and 0 (everywhere: embeddings, attention, "
        "feed-forward, heads). "
        "Margin: the larger seed std plus the task's `evaluate.encoder_spread`.", "",
        markdown(["task", "start", "rate", f"dropout {ran_dropout:g} (validation)", "dropout 0", "gain",
                  "margin", "verdict", "minutes without"], rows), ""]))


if __name__ == "__main__":
    main()
