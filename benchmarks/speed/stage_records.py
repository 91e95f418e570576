"""What the flow's bookkeeping costs per stage, DVC's way and bertflow's, side by side on one
project: recording the stage (`dvc commit`) with dvc.lock read round trip (ruamel, pure Python:
DVC's way) or by libyaml (the flow's), asking DVC whether the stage is stale (the flow does not
for a stage dvc.lock has never recorded), and its lineage tags hashed by DVC or read from its
record. The variants alternate, stage by stage, so both see the same machine.

Usage:  python -m benchmarks.speed.stage_records --project DIR [--stages 6] [--repeats 3]
  DIR: a DVC project after a whole `bertflow run` (the default run's, or a test's small one);
  its dvc.lock is rewritten with the same bytes, under the project lock.
Writes the "Stage records" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmarks.results import measured, write_section
from components.core.machine import cpu_facts
from pipeline import versioning
from pipeline.ops.lock import project_lock

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its params files and data/

SECTION = "## Stage records"


def seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--stages", type=int, default=6, help="stages of dvc.lock, evenly spread")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = args.project.resolve()
    lock = root / "dvc.lock"
    recorded = list(yaml.safe_load(lock.read_text())["stages"])
    stages = recorded[:: max(1, len(recorded) // args.stages)][: args.stages]
    entries = lock.read_text().count("- path: ")

    from dvc.utils.serialize import _yaml

    round_trip = _yaml.parse_yaml_for_update
    versioning.is_stale(root, stages[0])  # installs the flow's reader (and warms imports)
    libyaml = _yaml.parse_yaml_for_update
    before = lock.read_bytes()
    times: dict[str, list[float]] = {k: [] for k in ("commit_rt", "commit_c", "status", "hash", "read")}
    with project_lock(root):
        for _ in range(args.repeats):
            for stage in stages:
                _yaml.parse_yaml_for_update = round_trip
                times["commit_rt"].append(seconds(lambda s=stage: versioning.commit(root, s)))
                _yaml.parse_yaml_for_update = libyaml
                times["commit_c"].append(seconds(lambda s=stage: versioning.commit(root, s)))
                times["status"].append(seconds(lambda s=stage: versioning.is_stale(root, s)))
                times["hash"].append(seconds(lambda s=stage: versioning.dep_hashes(root, s)))
                times["read"].append(seconds(lambda s=stage: versioning.recorded_dep_hashes(root, s)))
    assert lock.read_bytes() == before, "dvc.lock changed"
    mean = {k: statistics.mean(v) for k, v in times.items()}
    dvc_way = mean["commit_rt"] + mean["status"] + mean["hash"]
    ours = mean["commit_c"] + mean["read"]
    rows = [
        f"| record the stage (`dvc commit`) | {mean['commit_rt']:.2f} | {mean['commit_c']:.2f} | "
        f"{mean['commit_rt'] / mean['commit_c']:.2f}× |",
        f"| is it stale? (a stage never recorded) | {mean['status']:.2f} | 0 | — |",
        f"| lineage tags | {mean['hash']:.2f} | {mean['read']:.3f} | {mean['hash'] / mean['read']:.0f}× |",
        f"| **per stage** | **{dvc_way:.2f}** | **{ours:.2f}** | **{dvc_way / ours:.2f}×** |",
    ]
    text = "\n".join([
        SECTION, "", measured(), "",
        f"Reproduce: `python -m benchmarks.speed.stage_records --project DIR --stages {args.stages} "
        f"--repeats {args.repeats}` after a whole `bertflow run` in DIR. Mean seconds per stage over "
        f"{len(stages)} stages of its dvc.lock ({len(recorded)} stages, {entries:,} deps and outputs, "
        f"{lock.stat().st_size / 1024:.0f} KB), {args.repeats} rounds, the variants alternating: what "
        "the flow does around each stage it runs, DVC's way (dvc.lock read round trip, DVC asked "
        "whether the stage is stale, its deps hashed for the MLflow lineage tags) and bertflow's "
        "(dvc.lock read by libyaml, a stage dvc.lock has never recorded taken as stale, the tags "
        f"read from the record just written). On {cpu_facts()['cpu_model']}, {os.cpu_count()} cores.",
        "",
        "| step | DVC's way (s) | bertflow's (s) | ratio |",
        "|---|---|---|---|",
        *rows,
        "",
    ])
    print(text)
    write_section(text)


if __name__ == "__main__":
    main()
