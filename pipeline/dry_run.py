"""`bertflow run --dry-run`: what a run would do, without running it: each stage in run order,
whether DVC finds it stale, what it holds while it runs and where its work goes."""

from __future__ import annotations

from pathlib import Path

from components.core.params import load_params
from pipeline import presets, versioning
from pipeline.placement import Ledger
from pipeline.run_plan import run_plan
from pipeline.stages import fits_cluster, held, plan, split_name, target


def dry_run(params_path: Path, until: str | None) -> list[str]:
    """The lines `bertflow run --dry-run` prints: a header, then a row per stage."""
    path = Path(params_path).resolve()
    root, p = path.parent, load_params(path)
    kept = versioning.is_dvc_project(root)
    run = run_plan(root, presets.owners(path, until) if kept else dict.fromkeys(plan(p, until), path), kept)
    ledger = Ledger.of_this_machine()
    total = ledger.total
    lines = [f"executor.stages: {p.executor.stages} at once, where what they hold is free on this machine "
             f"({total.cores} cores, {total.gpus} GPUs, {total.memory_gb:.0f} GB)"]
    rows = [("stage", "DVC", "holds here", "its fits")]
    for name in run.names:
        q, address = run.params_of(name), run.address[name]
        if not kept or address in run.stale or not versioning.recorded(root, address):
            status = "stale"
        elif any(run.address[d] in run.stale for d in run.upstream[name]):
            status = "if its inputs change"
        else:
            status = "up to date"
        fit = split_name(name)[0].fit
        cluster = fits_cluster(q, target(q, root, name)) if fit else None
        where = ("" if fit is None else f"{fit} each, on {cluster.address}" if cluster
                 else f"{ledger.resolve(fit)} each, on this machine")
        rows.append((name, status, str(ledger.resolve(held(q, name))), where))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += ["  ".join(f"{c:{w}s}" for c, w in zip(r, [*widths, 0], strict=True)).rstrip() for r in rows]
    return lines
