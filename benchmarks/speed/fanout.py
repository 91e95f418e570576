"""The default run's fine-tuning fanned out on a Dask cluster of one worker against two, on this
machine, in one run: the minutes from the first fine-tuning stage's start to the last one's end,
and whether the fits' bytes (dvc.lock) stay those of the run.

Each variant starts a scheduler and its workers (`dask scheduler`, `dask worker --nthreads 1`,
as docs/scaling.md's recipe; separate processes, so nothing they set reaches the run), removes
the project's fits and runs `bertflow run` with `executor.kind: dask` and `executor.stages: 2`:
DVC reruns the fine-tuning stages alone, each fit a task on the cluster. params.yaml is put back
afterwards.

Usage:  python -m benchmarks.speed.fanout [--project DIR] [--workers 1 2]
DIR ran `make run` (its task data and encoder), a throwaway clone: its fits are trained again
in place. Results: the "Fine-tuning fanned out on Dask" section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from benchmarks.exported import ROOT, project_option
from benchmarks.results import measured, write_section
from components.core.io import flatten
from components.core.params import load_params
from components.core.tracking import latest_stages

SECTION = "## Fine-tuning fanned out on Dask"
BIN = Path(sys.executable).parent


@contextlib.contextmanager
def cluster(workers: int) -> Iterator[str]:
    """A scheduler on loopback and `workers` one-thread workers; its address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stderr=subprocess.DEVNULL)]
    time.sleep(3)
    procs.append(subprocess.Popen([BIN / "dask", "worker", address, "--nworkers", str(workers),
                                   "--nthreads", "1", "--no-dashboard"], stderr=subprocess.DEVNULL))
    try:
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait()


def fine_tuning_minutes(project: Path) -> float:
    """Minutes from the first finetune stage's start to the last one's end in the latest run."""
    p = load_params(project / "params.yaml")
    stages = [r for r in latest_stages(p.tracking, project) if r["stage"].startswith("finetune@")]
    return (max(r["end"] for r in stages) - min(r["start"] for r in stages)) / 60_000


def fan_out(project: Path, workers: int) -> tuple[float, bool]:
    """Fine-tuning minutes on `workers` Dask workers, and whether dvc.lock came out the same."""
    params = project / "params.yaml"
    original, lock = params.read_text(), (project / "dvc.lock").read_bytes()
    p = load_params(params)
    shutil.rmtree(project / p.paths.models / "tasks")
    try:
        with cluster(workers) as address:
            data = yaml.safe_load(original)
            data["executor"].update(kind="dask", dask_address=address, stages=2)
            params.write_text(yaml.safe_dump(data, sort_keys=False))
            subprocess.run([BIN / "bertflow", "run"], cwd=project, check=True)
    finally:
        params.write_text(original)
    return fine_tuning_minutes(project), (project / "dvc.lock").read_bytes() == lock


def project_line(project: Path) -> str:
    """What the project's run was: its tasks, and each setting where its params.yaml is not this
    checkout's (the default run's), so a row measured on a cut-down clone says so."""
    ours, theirs = (yaml.safe_load((root / "params.yaml").read_text()) for root in (ROOT, project))
    tasks = list(theirs["finetune"].pop("tasks"))
    ours["finetune"].pop("tasks")
    default, got = flatten(ours), flatten(theirs)
    changed = [f"{key} {got.get(key)}" for key in sorted(default.keys() | got.keys())
               if default.get(key) != got.get(key)]
    rest = "the default params otherwise" if not changed else "the default params but " + ", ".join(changed)
    return f"Project: the fine-tuning of {len(tasks)} tasks ({', '.join(tasks)}), {rest}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    project_option(parser)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    got = {w: fan_out(args.project, w) for w in args.workers}
    base = got[args.workers[0]][0]
    rows = [f"| {w} | {minutes:.1f} | **{base / minutes:.2f}** | {'yes' if same else 'NO'} |"
            for w, (minutes, same) in got.items()]
    write_section("\n".join([
        SECTION, "", measured(), "",
        "Reproduce: `python -m benchmarks.speed.fanout --project DIR --workers "
        f"{' '.join(map(str, args.workers))}` (DIR a throwaway clone after `make run`; each variant "
        "its own scheduler and one-thread workers, executor.stages 2).", "", project_line(args.project), "",
        "| Dask workers | fine-tuning minutes | speed-up | same dvc.lock |", "|---|---|---|---|", *rows, ""]))


if __name__ == "__main__":
    main()
