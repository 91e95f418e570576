"""What glibc's allocator costs a pretraining step: the default preset's steps timed with glibc's
defaults against settings that keep freed memory in the process, side by side, interleaved.

A default pretraining step allocates and frees buffers larger than glibc's largest mmap
threshold (32 MB on 64-bit: the sparse MLM head's logits, ~1,200 masked positions x 16,384
pieces x 4 bytes = 80 MB, and their gradient), so every step maps them fresh and the kernel
faults their pages in again: the reference run's pretraining showed ~170k minor faults a second
and a fifth of its CPU time in the kernel. `glibc.malloc.mmap_max=0` serves them from the heap
instead, and a high trim threshold keeps the heap's top from being handed back each step. The
CLI sets both for every pipeline process (pipeline/ops/env.py); this measures what they buy.

Usage:  python -m benchmarks.speed.malloc [--steps 120] [--rounds 2]
Needs the pipeline's tokenizer and pairs (`make run` makes them). Results: the "Memory
allocator in pretraining" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.results import interleaved, measured, write_section
from pipeline.ops.env import TUNABLES

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Memory allocator in pretraining"
VARIANTS = {"glibc defaults": "", "mmap_max=0, trim_threshold=1 GiB (the CLI's)": TUNABLES}
CHILD = """
import json, sys
from pathlib import Path
from benchmarks.experiments.arch_probe import QUIET, trainer
from components.core.params import load_params
steps, short, out = int(sys.argv[1]), sys.argv[2] == "short", Path(sys.argv[3])
run = trainer(load_params(Path("params.yaml")), out, "malloc")
wall = run(out / "encoder", **QUIET, max_steps=steps, warmup_steps=0,
           short_seq_steps=steps if short else 0)[0]
print(json.dumps({"wall": wall}))
"""

def run(steps: int, short: bool, tunables: str) -> dict:
    """One pretraining run in a fresh process: its wall seconds, minor faults, user and system time."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", CHILD, str(steps), "short" if short else "full", tmp],
                             cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": json.loads(out.strip().splitlines()[-1])["wall"],
            "faults": after.ru_minflt - before.ru_minflt,
            "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime}


def per_step(steps: int, short: bool, tunables: str) -> dict:
    """A step's seconds, faults and system share: an N-step run less an N/4-step one (start-up out)."""
    long, brief = run(steps, short, tunables), run(steps // 4, short, tunables)
    n = steps - steps // 4
    cpu = (long["user"] + long["sys"]) - (brief["user"] + brief["sys"])
    # Differences of two runs: a variant that faults nothing per step comes out near 0, either side.
    return {"s": (long["wall"] - brief["wall"]) / n,
            "faults": max(0.0, (long["faults"] - brief["faults"]) / n),
            "sys_share": max(0.0, (long["sys"] - brief["sys"]) / cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    keys = [(name, short) for short in (True, False) for name in VARIANTS]
    got = interleaved(args.rounds, keys, lambda key: per_step(args.steps, key[1], VARIANTS[key[0]]))
    write_section(section(args, got))


def section(args: argparse.Namespace, got: dict) -> str:
    """The RESULTS.md section: per phase and variant, every round's seconds a step and the medians."""
    rows = []
    for short in (True, False):
        base = statistics.median(r["s"] for r in got["glibc defaults", short])
        for name in VARIANTS:
            rs = got[name, short]
            s = statistics.median(r["s"] for r in rs)
            rows.append(f"| {'32-token curriculum' if short else 'full length'} | {name} | "
                        f"{' / '.join(format(r['s'], '.3f') for r in rs)} | "
                        f"{statistics.median(r['faults'] for r in rs):,.0f} | "
                        f"{statistics.median(r['sys_share'] for r in rs):.0%} | **{base / s:.2f}** |")
    return "\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.malloc --steps {args.steps} --rounds {args.rounds}` "
        "(the default preset, 2 threads; each variant's runs in fresh processes, interleaved; "
        "a step is an N-step run less an N/4-step one; medians over rounds).", "",
        "| phase | GLIBC_TUNABLES | s / step, each round | minor faults / step | "
        "system share of CPU time | speed-up (medians) |",
        "|---|---|---|---|---|---|", *rows])


if __name__ == "__main__":
    main()
