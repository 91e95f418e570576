"""How this checkout's outputs differ from the committed reference, and why they may.

The reference is what git's HEAD holds: its `dvc.lock` (an md5 per output) and the machine facts
in its `pretrain_stats.json` (components.core.machine). A run on another CPU model writes other
models from the same inputs; `bertflow metrics` and `bertflow report` then say which outputs
differ and which facts of the machine differ, instead of leaving a bare `git status`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from components.core.machine import differences


def drift(root: Path, metrics_dir: Path) -> list[str]:
    """Lines for a person: the outputs whose md5 differs from HEAD's dvc.lock, and the machine
    facts that differ from the reference's; [] when everything matches or there is no reference."""
    committed = _at_head(root, "dvc.lock")
    current = root / "dvc.lock"
    if committed is None or not current.is_file():
        return []
    before, now = _outs(committed), _outs(current.read_text(encoding="utf-8"))
    changed = sorted(path for path in before.keys() & now.keys() if before[path] != now[path])
    if not changed:
        return []
    lines = [f"differs from the committed reference (git HEAD): {len(changed)} of {len(before)} "
             f"outputs: {', '.join(changed[:8])}{', ...' if len(changed) > 8 else ''}"]
    stats = metrics_dir / "pretrain_stats.json"
    reference = _at_head(root, stats.relative_to(root).as_posix()) if stats.is_relative_to(root) else None
    if reference is not None and stats.is_file():
        facts = differences(json.loads(reference).get("machine", {}),
                            json.loads(stats.read_text(encoding="utf-8")).get("machine", {}))
        lines.append("  machine facts, the reference's -> this run's: " + ("; ".join(facts) if facts else
                     "none differ (the inputs or the code do: `dvc status`, `git diff`)"))
    return lines


def _outs(lock_text: str) -> dict[str, str]:
    """path -> md5 of every output in a dvc.lock."""
    stages = (yaml.safe_load(lock_text) or {}).get("stages", {})
    return {out["path"]: out.get("md5", "") for stage in stages.values() for out in stage.get("outs", [])}


def _at_head(root: Path, path: str) -> str | None:
    """The text of `path` at git's HEAD, or None (not a checkout, not committed)."""
    try:
        proc = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None
