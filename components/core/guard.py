"""Where bertflow may write: one check, in one place, used by every writer.

Two rules, mechanisms rather than a list of cases:
- Ownership. A folder is replaced or removed only when bertflow made it: every folder it makes
  carries an OWNED marker, and a non-empty folder without one is refused, naming the key or
  argument that pointed there. (A file you name with `--out` is replaced; a folder never is.)
- Places. Output paths are resolved (symlinks followed) and may not overlap, either way, the
  project's code, environment, inputs or stores; stage outputs also lie inside the project's
  `data/` or `metrics/` folder.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from components.core.config import Params
from components.core.errors import ConfigError

OWNED = ".bertflow-owned"
_OWNED_TEXT = "bertflow made this folder; it replaces or removes a folder only while this file is in it.\n"
OUTPUT_AREAS = ("data", "metrics")  # the project folders that stage outputs must lie inside
OUTPUT_FOLDERS = ("raw", "clean", "checkpoint", "tokenizer", "pairs", "tasks", "models", "metrics")
SOURCE_FOLDERS = ("user_data", "packages")  # read (packages also installed into), never replaced
# Always protected, git or not: the code, the environment and the stores of the embedded defaults.
_CODE = ("components", "pipeline", "tests", "benchmarks", "docs", ".git", ".ci")
_STORES = (".venv", ".dvc", ".prefect", "mlartifacts", "mlruns")


class OwnershipError(ConfigError):
    """A command was pointed at a folder it did not make, or at code, inputs or stores."""


def mark(folder: Path) -> None:
    """Mark `folder` as made by bertflow (done by every writer when it makes a folder)."""
    (Path(folder) / OWNED).write_text(_OWNED_TEXT, encoding="utf-8")


def make_owned(folder: Path, what: str = "") -> Path:
    """Create `folder` (or take it, if bertflow made it or it is empty) and mark it."""
    folder = Path(folder)
    claim(folder, what)
    folder.mkdir(parents=True, exist_ok=True)
    mark(folder)
    return folder


def claim(folder: Path, what: str = "") -> None:
    """Refuse to replace `folder` unless it is missing, empty, or marked as bertflow's."""
    folder = Path(folder)
    name = f"{what}: {folder}" if what else str(folder)
    if folder.is_symlink():
        raise OwnershipError(f"{name} is a symbolic link; bertflow replaces only folders it made, "
                             "never what a link points to")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise OwnershipError(f"{name} is a file, not a folder bertflow made; name a new folder")
    if (folder / OWNED).is_file() or not any(folder.iterdir()):
        return
    raise OwnershipError(f"{name} holds files bertflow did not write (no {OWNED} in it), and it "
                         "replaces only folders it made; name a new folder, or move that one "
                         "away yourself")


def remove_owned(folder: Path) -> bool:
    """Remove `folder` if bertflow made it (marked, or empty); True if it is gone."""
    folder = Path(folder)
    try:
        claim(folder)
    except OwnershipError:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


@dataclass(frozen=True)
class Place:
    """A protected path: nothing is written onto it, into it or around it."""

    path: Path
    """Resolved."""
    what: str
    """What it is, for the error message ("your data (paths.user_data)")."""
    holder: bool = False
    """The checkout (or a folder holding a store): outputs may lie inside it, never be it or hold it."""


def resolved(path: Path) -> Path:
    """`path` with symlinks followed (those not there yet taken as written); loops are not followed."""
    return Path(os.path.realpath(path))


def check_place(path: Path, name: str, places: Iterable[Place]) -> Path:
    """Refuse an output `path` that is, holds, or (unless a holder) lies inside a protected place;
    `name` says who pointed there ("paths.raw: 'components'", "export-hf OUT: x"). Returns the
    resolved path."""
    target = resolved(path)
    for place in places:
        inside = place.path in target.parents
        if target == place.path or target in place.path.parents or (inside and not place.holder):
            raise OwnershipError(f"{name}{_via(path, target)} overlaps {place.what} ({place.path}); "
                                 "bertflow writes only folders of its own, apart from code, "
                                 "inputs and stores")
    return target


def check_output_area(path: Path, name: str, root: Path) -> Path:
    """A stage output must lie inside the project's data/ or metrics/ (after links are followed)."""
    target, root = resolved(path), resolved(root)
    areas = [root / area for area in OUTPUT_AREAS]
    if not any(a in target.parents for a in areas) and target != areas[1]:
        raise OwnershipError(f"{name}{_via(path, target)} must be a folder inside "
                             f"{' or '.join(f'{a}/' for a in OUTPUT_AREAS)} of the project "
                             f"({root}); a stage replaces it")
    return target


def _via(path: Path, target: Path) -> str:
    return "" if target == Path(os.path.abspath(path)) else f" (a link to {target})"


def check_stage_outputs(p: Params, root: Path, where: str) -> None:
    """Every `paths.*` output lies inside data/ or metrics/, apart from the others and from every
    protected place of the project (code, environment, stores, inputs); `where` prefixes keys."""
    places = params_places(p, root)
    for name in SOURCE_FOLDERS:
        value = getattr(p.paths, name)
        if not value.strip() or Path(os.path.normpath(root / value)) == root:
            raise ConfigError(f"{where}paths.{name}: {value!r} is the project root; give it a "
                              "folder of its own")
    for name in OUTPUT_FOLDERS:
        value = getattr(p.paths, name)
        label = f"{where}paths.{name}: {value!r}"
        if not value.strip() or Path(value).is_absolute():
            raise ConfigError(f"{label} must be a folder inside data/ or metrics/ of the project "
                              f"({root}); a stage replaces it")
        target = check_output_area(root / value, label, root)
        check_place(root / value, label, places)
        places.append(Place(target, f"paths.{name} ({value!r})"))


def check_command_output(path: Path, name: str, p: Params, root: Path) -> Path:
    """An output a command writes where you say (export-hf's folder, an --out file): apart from
    every protected place and every stage output. Returns it resolved."""
    outputs = [Place(resolved(root / getattr(p.paths, n)), f"the stage output paths.{n}")
               for n in OUTPUT_FOLDERS]
    return check_place(path, name, [*params_places(p, root), *outputs])


def params_places(p: Params, root: Path) -> list[Place]:
    """The protected places of the project that params `p` (in `root`) describe: its inputs too."""
    inputs = {f"paths.{n} ({getattr(p.paths, n)!r})": getattr(p.paths, n) for n in SOURCE_FOLDERS}
    inputs.update({f"ingest source {s.name!r} ({s.path!r})": s.path for s in p.ingest.sources})
    inputs.update({f"the source of task {t!r} ({c.source!r})": c.source
                   for t, c in p.finetune.tasks.items()})
    inputs[f"pretrain.init_from ({p.pretrain.init_from!r})"] = p.pretrain.init_from
    return project_places(root, inputs, (p.tracking.uri, p.tracking.artifacts))


def project_places(root: Path, inputs: dict[str, str], tracking: tuple[str, str] = ("", "")) -> list[Place]:
    """The protected places of the project at `root`: the checkout, its code (git-tracked top-level
    entries other than data/ and metrics/, and the code folders), environment and stores (`.dvc`,
    the DVC remote, `.prefect`, MLflow's database and artifacts), and `inputs` (what: path)."""
    root = resolved(root)
    places = [Place(root, "the project folder", holder=True)]
    for name in _STORES:  # before the code: a store git tracks by mistake is still a store
        places.append(Place(resolved(root / name), f"a store or environment ({name})"))
    for name in sorted({*_CODE, *_tracked_top_level(root)} - set(OUTPUT_AREAS) - set(_STORES)):
        places.append(Place(resolved(root / name), f"the project's code ({name})"))
    for remote in _dvc_remotes(root):
        places.append(Place(remote, "the DVC remote"))
    uri, artifacts = tracking
    for store in (_local_path(uri, root), _local_path(artifacts, root)):
        if store is not None:
            places.append(Place(store, "MLflow's store"))
            places.append(Place(store.parent, "the folder of MLflow's store", holder=True))
    for what, value in inputs.items():
        if value:
            places.append(Place(resolved(root / value), what))
    return places


def _tracked_top_level(root: Path) -> set[str]:
    """The top-level names git tracks at `root` (empty outside a git checkout)."""
    try:
        proc = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if proc.returncode != 0:
        return set()
    return {p.split("/", 1)[0] for p in proc.stdout.decode("utf-8", "replace").split("\0") if p}


def _dvc_remotes(root: Path) -> list[Path]:
    """Local folders that the project's DVC config names as remotes."""
    out = []
    for name in ("config", "config.local"):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(root / ".dvc" / name, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            continue
        for section in parser.sections():
            url = parser[section].get("url", "") if section.startswith("remote") else ""
            if url and "://" not in url:
                out.append(resolved(root / ".dvc" / url))
    return out


def _local_path(uri: str, root: Path) -> Path | None:
    """The local file or folder a tracking URI or artifact location names, else None."""
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri.split("sqlite:///", 1)[-1] if "sqlite:///" in uri else ""
        return resolved(root / path) if path and path != ":memory:" else None
    if parsed.scheme in ("", "file"):
        return resolved(root / (parsed.path if parsed.scheme else uri))
    return None
