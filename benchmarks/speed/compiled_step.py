"""The pipeline's own pretraining step eager and through `torch.compile` (`pretrain.compile: on`),
side by side: params.yaml's recipe on the project's pairs, each phase (the 32-token curriculum,
full length) in fresh processes, interleaved over rounds.

A step is timed from one batch's end to the next's (Lightning's loop, the batch building and the
optimizer included), after `--warmup` steps; the median over the rest, so that a recompilation
does not count as a slow step. What compiling costs is the first steps' excess over that median.

Usage:  python -m benchmarks.speed.compiled_step [--steps 120] [--rounds 2]
Needs the pipeline's tokenizer and pairs (`make run` makes them). Results: the "Compiled
pretraining step" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.results import interleaved, measured, write_section

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Compiled pretraining step"
CHILD = """
import json, statistics, sys, tempfile, time
from pathlib import Path
from pipeline.ops import env
env.configure()  # the CLI's allocator settings and quiet logs
from components.core.params import load_params
from components.training.pretrain import pretrain
from components.training.pretrain_module import PretrainModule
steps, short, setting, warmup = int(sys.argv[1]), sys.argv[2] == "short", sys.argv[3], int(sys.argv[4])
ends = []  # the loop's start, then each batch's end: the first step holds the compilation
on_train_start = PretrainModule.on_train_start
PretrainModule.on_train_start = lambda self: (ends.append(time.perf_counter()), on_train_start(self))
PretrainModule.on_train_batch_end = lambda self, *args: ends.append(time.perf_counter())
p = load_params(Path("params.yaml"))
quiet = {"val_every_steps": 10**9, "snapshot_every_steps": 10**9, "log_every_steps": 10**9}
cfg = p.pretrain.model_copy(update={**quiet, "max_steps": steps, "warmup_steps": 0,
                                    "short_seq_steps": steps if short else 0, "compile": setting})
with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    stats = pretrain(model=p.model, cfg=cfg, pairs_dir=Path(p.paths.pairs),
                     tokenizer_dir=Path(p.paths.tokenizer), out_dir=Path(tmp) / "encoder",
                     work_dir=Path(tmp) / "work")
steps_s = [b - a for a, b in zip(ends, ends[1:])]
median = statistics.median(steps_s[warmup:])
print(json.dumps({"median": median, "excess": sum(steps_s[:warmup]) - warmup * median,
                  "loss": stats["mlm_loss"], "compiled": stats["compiled"]}))
"""
VARIANTS = ("off", "on")


def run(steps: int, short: bool, setting: str, warmup: int) -> dict:
    """One pretraining run in a fresh process: its median step, first steps' excess, final loss."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(steps), "short" if short else "full", setting,
                          str(warmup)], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    keys = [(setting, short) for short in (True, False) for setting in VARIANTS]
    got = interleaved(args.rounds, keys, lambda key: run(args.steps, key[1], key[0], args.warmup))
    write_section(section(args, got))


def section(args: argparse.Namespace, got: dict) -> str:
    """The RESULTS.md section: per phase and variant, every round's median step and the ratio."""
    rows = []
    for short in (True, False):
        base = statistics.median(r["median"] for r in got["off", short])
        for setting in VARIANTS:
            rs = got[setting, short]
            s = statistics.median(r["median"] for r in rs)
            rows.append(f"| {'32-token curriculum' if short else 'full length'} | "
                        f"{'compiled' if setting == 'on' else 'eager'} | "
                        f"{' / '.join(format(r['median'], '.3f') for r in rs)} | "
                        f"{statistics.median(r['excess'] for r in rs):.1f} | "
                        f"{statistics.median(r['loss'] for r in rs):.6f} | **{base / s:.2f}** |")
    return "\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.compiled_step --steps {args.steps} --rounds {args.rounds}` "
        f"(params.yaml's recipe and preset on the project's pairs; each run a fresh process, "
        f"interleaved; a step's seconds: the median after {args.warmup} warm-up steps; medians over "
        "rounds).", "",
        "| phase | step | s / step, each round | first steps' excess, s | held-out MLM loss at the end | "
        "speed-up |",
        "|---|---|---|---|---|---|", *rows])


if __name__ == "__main__":
    main()
