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
