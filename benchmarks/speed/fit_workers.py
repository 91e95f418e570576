"""A fine-tuning stage's fits (one start of one task, its seeds) in 2 worker processes against 3
on this machine, side by side, interleaved over rounds: wall seconds, and that the fits are the
same to the bit (each has one thread either way).

On 2 cores, 2 workers fit seeds 1 and 2, then seed 3 alone beside an idle core; 3 workers fit
all three at once, sharing the cores (what `finetune.workers: 0` does there now).

Usage:  python -m benchmarks.speed.fit_workers [--project DIR] [--task movie-sentiment] [--rounds 2]
DIR ran `make run` (its task data and encoder). Results: the "Fits on 2 cores" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.exported import project_option
from benchmarks.results import interleaved, measured, write_section
from components.core.params import load_params
from components.training.finetune import finetune_start

SECTION = "## Fits on 2 cores"
VARIANTS = (2, 3)


def stage(project: Path, task: str, init: str, workers: int) -> tuple[float, dict]:
    """One start's fits with `workers` processes: wall seconds, and each fit's steps and score."""
    p = load_params(project / "params.yaml")
    cfg = p.finetune.model_copy(update={"workers": workers})
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        stats = finetune_start(task, p.finetune.tasks[task], cfg, init=init,
                               task_dir=project / p.paths.tasks / task,
                               encoder_dir=project / p.paths.models / "encoder", out_dir=Path(tmp) / init)
        return time.perf_counter() - start, stats["fits"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    project_option(parser)
    parser.add_argument("--task", default="movie-sentiment", help="a task of one rate (no search)")
    parser.add_argument("--init", default="pretrained")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    got = interleaved(args.rounds, list(VARIANTS),
                      lambda workers: stage(args.project, args.task, args.init, workers))
    walls = {w: [wall for wall, _ in runs] for w, runs in got.items()}
    fits = {w: runs[-1][1] for w, runs in got.items()}
    same = all(run[1] == fits[2] for runs in got.values() for run in runs)
    base = statistics.median(walls[2])
    rows = [f"| {w} | {' / '.join(f'{s:.0f}' for s in walls[w])} | "
            f"**{base / statistics.median(walls[w]):.2f}** |" for w in VARIANTS]
    write_section("\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.fit_workers --task {args.task} --init {args.init} "
        f"--rounds {args.rounds}` (a project after `make run`; each fit one thread).", "",
        f"finetune@{args.task}-{args.init}'s fits, {len(fits[2])} seeds at one rate, in 2 and in 3 worker "
        f"processes; the fits' steps and validation scores {'identical' if same else 'DIFFER'} "
        "between the two.", "",
        "| workers | stage seconds, each round | speed-up |", "|---|---|---|", *rows]))


if __name__ == "__main__":
    main()
