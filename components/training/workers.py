"""Fits trained side by side in worker processes: on CPU a small model's step is too short to
keep two cores busy, so on 2 cores two fits of one thread each did ~1.25x the work of one fit
of two threads. Three fits on two cores run as three processes that share the cores (about 1.5
fits' time) rather than two then one with a core idle (2 fits' time); each still has one thread,
so its result is the same to the bit."""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from components.core.logs import configure_logging
from components.core.progress import bar

OVERSUBSCRIBE = 1.5  # with workers 0 on CPU, up to this many processes per core (see above)


def worker_count(workers: int, items: int) -> int:
    """Processes to use: `workers`, or with 0 one per fit up to 1.5 per CPU core on CPU (one
    thread each once they outnumber the cores) and one on a GPU."""
    if workers == 0:
        workers = 1 if torch.cuda.is_available() else math.ceil(OVERSUBSCRIBE * (os.cpu_count() or 1))
    return max(1, min(workers, items))


def threads_per_worker(workers: int) -> int:
    """Torch threads of each of `workers` processes: the cores split between them."""
    return max(1, (os.cpu_count() or 1) // workers)


def fit_threads(workers: int) -> int:
    """Torch threads of each fit when `workers` fits run at once: a worker's share of the cores,
    or this process's own when the fits run here, one after another."""
    return threads_per_worker(workers) if workers > 1 else torch.get_num_threads()


def map_in_processes(fn: Callable[..., Any], shared: Any, items: Sequence[tuple], workers: int,
                     desc: str) -> list[Any]:
    """`[fn(shared, *item) for item in items]` in `workers` spawned processes, in order; `shared`
    is shipped once to each process, and the cores are split between them."""
    threads = threads_per_worker(workers)
    # Spawned, not forked: the parent's torch and tokenizers thread pools don't survive fork.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init, initargs=(fn, shared, threads)) as pool:
        return list(bar(pool.map(_call, items), desc, len(items), "fit"))


_WORK: tuple[Callable[..., Any], Any] | None = None  # a worker process's function and shared data


def _init(fn: Callable[..., Any], shared: Any, threads: int) -> None:
    global _WORK
    configure_logging()  # the same quiet logging as the parent
    torch.set_num_threads(threads)
    _WORK = (fn, shared)


def _call(item: tuple) -> Any:
    assert _WORK is not None
    fn, shared = _WORK
    return fn(shared, *item)


@dataclass(frozen=True)
class Cluster:
    """A Dask cluster that trains fits: its scheduler's address, and the worker resources each fit
    holds there (`{"GPU": 1}`: a worker that declares a GPU; not asked of workers that declare none)."""

    address: str
    resources: dict[str, float] = field(default_factory=dict)


def map_on_cluster(fn: Callable[..., Any], shared: Any, items: Sequence[tuple], cluster: Cluster,
                   threads: int, desc: str) -> list[Any]:
    """`[fn(shared, *item) for item in items]` as tasks on `cluster`, in order: `shared` is
    scattered to the workers once, and each task runs on `threads` torch threads, as a local
    worker process would, so a fit's bits do not depend on where it ran. A task takes one worker
    thread (fit workers start with `--nthreads 1`: one fit at a time each) and the resources a
    fit holds, where the workers declare them (docs/scaling.md)."""
    from dask.distributed import Client

    with Client(cluster.address, timeout="30s") as client:
        declared = {r for w in client.scheduler_info()["workers"].values() for r in w.get("resources", {})}
        resources = {k: v for k, v in cluster.resources.items() if k in declared} or None
        data = client.scatter(shared, broadcast=True, hash=False)
        env = {k: os.environ[k] for k in THREAD_VARS if k in os.environ}
        futures = [client.submit(_call_on_worker, fn, data, item, threads, env, pure=False,
                                 resources=resources) for item in items]
        return list(bar((f.result() for f in futures), desc, len(items), "fit"))


# Dask's nanny sets its workers' thread-count variables to 1. A fit sets its own count, and the
# machine facts recorded with it (components.core.machine) list these variables: a fit on a
# worker runs with the stage's, as a local worker process, which inherits them, does.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _call_on_worker(fn: Callable[..., Any], shared: Any, item: tuple, threads: int,
                    env: dict[str, str]) -> Any:
    """One task on a Dask worker: the stage's thread variables and the fit's threads, then
    `fn(shared, *item)`."""
    for key in THREAD_VARS:
        os.environ.pop(key, None)
    os.environ.update(env)
    configure_logging()
    torch.set_num_threads(threads)
    return fn(shared, *item)
