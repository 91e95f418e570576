"""What a stage holds while it runs, and the flow's ledger of what is free: with `executor.stages`
above 1, a ready stage starts only when the cores, GPUs and memory it holds are free here.

Each stage declares its needs once, on the stage table (pipeline.stages). A stage that trains
fits declares what one fit holds too: with `executor.kind: dask` its fits are tasks on the
cluster, each on a worker of its own (and a GPU, where the workers declare `GPU`), and the stage
itself holds only one core here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ALL = -1  # every core, or every GPU, of the machine running the stage


@dataclass(frozen=True)
class Needs:
    """What a stage (or one of its fits) holds while it runs."""

    cores: int = 1
    """CPU cores (ALL: every core; the data stages and local fits run a process per core)."""
    gpus: int = 0
    """GPUs, on a machine that has them (ALL: every one; pretraining's DDP)."""
    memory_gb: float = 1.0
    """Resident memory at its peak on the default params, rounded up: an estimate, not a limit."""

    def on(self, cores: int, gpus: int) -> Needs:
        """These needs on a machine with `cores` and `gpus`: ALL resolved, none above what it has."""
        def fit(want: int, have: int) -> int:
            return have if want == ALL else min(want, have)

        return Needs(fit(self.cores, cores), fit(self.gpus, gpus), self.memory_gb)

    def dask_resources(self) -> dict[str, float]:
        """Dask worker resources a fit asks for: a GPU each where it wants one (cores: a worker
        thread; docs/scaling.md starts fit workers with one)."""
        return {"GPU": self.gpus} if self.gpus else {}

    def __str__(self) -> str:
        def count(n: int, what: str) -> str:
            return f"all {what}s" if n == ALL else f"{n} {what}{'s' if n != 1 else ''}"

        gpus = f", {count(self.gpus, 'GPU')}" if self.gpus else ""
        return f"{count(self.cores, 'core')}{gpus}, {self.memory_gb:g} GB"


ONE_CORE = Needs()  # a stage whose fits run on a cluster: it waits for them here


class Ledger:
    """The cores, GPUs and memory of this machine that running stages hold. The flow starts a
    ready stage only if `take` finds its needs free, and `give`s them back when it ends. Needs
    are cut to what the machine has: at worst a stage runs alone."""

    def __init__(self, cores: int, gpus: int, memory_gb: float):
        self.total = Needs(cores, gpus, memory_gb)
        self.free = self.total

    @classmethod
    def of_this_machine(cls) -> Ledger:
        """A ledger of this machine's cores, GPUs and memory."""
        import psutil
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(os.cpu_count() or 1, gpus, psutil.virtual_memory().total / 2**30)

    def resolve(self, needs: Needs) -> Needs:
        """`needs` on this machine: ALL resolved, and memory no more than it has."""
        held = needs.on(self.total.cores, self.total.gpus)
        return Needs(held.cores, held.gpus, min(held.memory_gb, self.total.memory_gb))

    def take(self, needs: Needs) -> bool:
        """Hold `needs` (resolved) if they are free now; whether they were."""
        want, free = self.resolve(needs), self.free
        if want.cores > free.cores or want.gpus > free.gpus or want.memory_gb > free.memory_gb:
            return False
        self.free = Needs(free.cores - want.cores, free.gpus - want.gpus, free.memory_gb - want.memory_gb)
        return True

    def give(self, needs: Needs) -> None:
        """Free what `take(needs)` held."""
        held, free = self.resolve(needs), self.free
        self.free = Needs(free.cores + held.cores, free.gpus + held.gpus, free.memory_gb + held.memory_gb)
