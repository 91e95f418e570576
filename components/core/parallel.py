"""Run a function over shards: a local process pool, a Dask cluster, or in-process."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from components.core.config import ExecutorConfig
from components.core.progress import bar


class ShardExecutor:
    """`with ShardExecutor(cfg) as ex: results = ex.map(fn, items)`; results keep input order.

    `fn` must be a module-level function and items picklable: local workers are spawned (not
    forked, so the Rust thread pools of `tokenizers` are safe) and Dask ships them to other hosts.
    """

    def __init__(self, cfg: ExecutorConfig):
        self.cfg = cfg
        self._pool: ProcessPoolExecutor | None = None
        self._client: Any = None

    def __enter__(self) -> ShardExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        if self._client is not None:
            self._client.close()

    @property
    def workers(self) -> int:
        """Local worker processes this executor uses."""
        return self.cfg.workers or os.cpu_count() or 1

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], desc: str = "shards") -> list[Any]:
        """Apply `fn` to every item (in parallel where configured) and return results in order;
        `desc` labels the progress bar (see components.core.progress)."""
        if self.cfg.kind == "serial" or (self.cfg.kind == "processes" and
                                         (self.workers == 1 or len(items) <= 1)):
            return [fn(item) for item in bar(items, desc, len(items), "shard")]
        if self.cfg.kind == "dask":
            if self._client is None:
                from dask.distributed import Client  # heavy; only when a cluster is asked for

                self._client = Client(self.cfg.dask_address)
            return self._client.gather(self._client.map(fn, items, pure=False))
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn")
            )
        return list(bar(self._pool.map(fn, items), desc, len(items), "shard"))
