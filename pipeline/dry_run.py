"""`bertflow run --dry-run`: what a run would do, without running it: each stage in run order,
whether DVC finds it stale, what it holds while it runs and where its work goes."""

from __future__ import annotations

from pathlib import Path

from components.core.params import load_params
from pipeline import pipelines, presets, versioning
from pipeline.placement import Ledger
from pipeline.stages import fits_cluster, held, plan, split_name, target


def dry_run(params_path: Path, until: str | None) -> list[str]:
    """The lines `bertflow run --dry-run` prints: a header, then a row per stage."""
    from pipeline.flow import dependencies

    path = Path(params_path).resolve()
    root, p = path.parent, load_params(path)
    kept = versioning.is_dvc_project(root)
    owners = presets.owners(path, until) if kept else dict.fromkeys(plan(p, until), path)
    address = {n: pipelines.address(o, n) if pipelines.is_preset(o) else n for n, o in owners.items()}
    files = sorted({a.rpartition(":")[0] or "dvc.yaml" for a in address.values()})
    stale = versioning.stale_stages(root, files) if kept else set(address.values())
    upstream = dependencies(owners)
    ledger = Ledger.of_this_machine()
    total = ledger.total
    lines = [f"executor.stages: {p.executor.stages} at once, where what they hold is free on this machine "
             f"({total.cores} cores, {total.gpus} GPUs, {total.memory_gb:.0f} GB)"]
    rows = [("stage", "DVC", "holds here", "its fits")]
    for name, owner in owners.items():
        q = load_params(owner) if owner != path else p
        if address[name] in stale or (kept and not versioning.recorded(root, address[name])):
            status = "stale"
        elif any(address[d] in stale for d in upstream[name]):
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
