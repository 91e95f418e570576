"""The stages one run takes, in run order, and DVC's books of them: which params file owns each
stage, how DVC names it, the stages it reads and DVC's verdict at the start. The flow runs from
it; `bertflow run --dry-run` shows it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from components.core.config import Params
from components.core.params import load_params
from pipeline import pipelines, versioning
from pipeline.stages import producers


@dataclass(frozen=True)
class RunPlan:
    """A run's stages (the keys of `owners`, in run order) and what the flow knows of them."""

    owners: dict[str, Path]
    """Each stage and the params file whose pipeline records it (params.yaml's, or a preset's)."""
    params: dict[Path, Params]
    """Each owner's params, loaded once."""
    address: dict[str, str | None]
    """How DVC names each stage (`name`, or `presets/NAME/dvc.yaml:name`); None outside DVC."""
    upstream: dict[str, set[str]]
    """The stages of the run each one reads, directly or not: it runs once they have, and DVC's
    verdict on it changes only if one of them ran."""
    stale: set[str]
    """The addresses DVC finds stale at the start (asked once, for every pipeline file)."""

    @property
    def names(self) -> list[str]:
        """The stages, in run order."""
        return list(self.owners)

    def params_of(self, name: str) -> Params:
        """The params stage `name` runs with."""
        return self.params[self.owners[name]]


def run_plan(root: Path, owners: dict[str, Path], kept: bool) -> RunPlan:
    """The plan of the stages `owners` (in run order) of the project at `root`; `kept`: whether
    it is a DVC project."""
    params = {path: load_params(path) for path in dict.fromkeys(owners.values())}
    address = {n: (pipelines.address(o, n) if pipelines.is_preset(o) else n) if kept else None
               for n, o in owners.items()}
    files = sorted({a.rpartition(":")[0] or "dvc.yaml" for a in address.values() if a})
    upstream: dict[str, set[str]] = {}
    for name, owner in owners.items():  # in run order: a stage's producers come first
        direct = [d for d in producers(params[owner], name) if d in owners]
        upstream[name] = set(direct).union(*(upstream[d] for d in direct))
    return RunPlan(owners, params, address, upstream,
                   versioning.stale_stages(root, files) if kept else set())
