"""Where bertflow may write: one check, in one place, used by every writer.

Two rules, mechanisms rather than a list of cases:
- Ownership. A folder is replaced or removed only when every file in it is one bertflow wrote.
  A finished folder (a stage output, an export, a data-package install) holds an OWNED marker
  that lists every file and folder bertflow put there, with each file's size and SHA-256; a
  folder bertflow is still writing (a temp folder, pretraining's snapshots) holds a WORK marker
  naming the folder itself (its inode, which no copy keeps). A marker that does not describe its
  folder (copied, made by hand, or the folder holds files it does not list, or changed ones) is
  refused, naming the files bertflow did not write. (A file you name with `--out` is replaced; a
  folder never is.)
- Places. Output paths are resolved (symlinks followed) and may not overlap, either way, the
  project's code, environment, inputs or stores; stage outputs also lie inside the project's
  `data/` or `metrics/` folder.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from components.core.config import Params
from components.core.errors import ConfigError

OWNED = ".bertflow-owned"  # in a finished folder: what bertflow put there (its manifest)
WORK = ".bertflow-work"  # in a folder bertflow is writing: which folder it was made as
MARKERS = (OWNED, WORK)
_ABOUT = ("bertflow made this folder and lists here everything it put in it; it replaces or "
          "removes the folder only while the folder holds nothing else and each file is unchanged")
OUTPUT_AREAS = ("data", "metrics")  # the project folders that stage outputs must lie inside
OUTPUT_FOLDERS = ("raw", "clean", "checkpoint", "tokenizer", "pairs", "tasks", "models", "metrics")
SOURCE_FOLDERS = ("user_data", "packages")  # read (packages also installed into), never replaced
# Always protected, git or not: the code, the environment and the stores of the embedded defaults.
_CODE = ("components", "pipeline", "tests", "benchmarks", "docs", ".git", ".ci")
_STORES = (".venv", ".dvc", ".prefect", "mlartifacts", "mlruns")
_NAMED = 5  # foreign files an error names before "and N more"


class OwnershipError(ConfigError):
    """A command was pointed at a folder it did not make, or at code, inputs or stores."""


def mark(folder: Path) -> None:
    """Mark the finished `folder` as bertflow's: its OWNED manifest lists what it holds now.

    The manifest depends on the folder's content alone (no times, no absolute paths), so equal
    outputs carry equal markers and DVC's hashes of them stay reproducible; a `dvc checkout` of
    the folder restores a marker that still describes it."""
    folder = Path(folder)
    folders, files = [], {}
    for rel, path, kind in _entries(folder):
        if kind == "folder":
            folders.append(rel)
        elif kind == "file":
            files[rel] = [path.stat().st_size, _sha256(path)]
        else:
            raise OwnershipError(f"{path} is {kind}; bertflow writes only files and folders")
    manifest = {"bertflow": "owned", "about": _ABOUT, "folders": folders, "files": files}
    (folder / OWNED).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def mark_work(folder: Path) -> None:
    """Mark `folder` as one bertflow is writing into: the marker names the folder by its inode,
    which a copy of the folder (or of the marker) does not keep."""
    record = {"bertflow": "work", "inode": Path(folder).stat().st_ino}
    (Path(folder) / WORK).write_text(json.dumps(record) + "\n", encoding="utf-8")


def make_work(folder: Path, what: str = "") -> Path:
    """Create the work folder `folder` (or take it, if it is bertflow's or empty) and mark it as
    one bertflow writes into (pretraining's snapshots, adapt's pairs); returns it."""
    folder = Path(folder)
    claim(folder, what)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / WORK).is_file():
        mark_work(folder)
    return folder


def claim(folder: Path, what: str = "") -> None:
    """Refuse to replace `folder` unless it is missing, empty, or every file in it is bertflow's:
    a WORK marker made in this very folder, or an OWNED manifest that lists each entry as it is."""
    folder = Path(folder)
    name = f"{what}: {folder}" if what else str(folder)
    if folder.is_symlink():
        raise OwnershipError(f"{name} is a symbolic link; bertflow replaces only folders it made, "
                             "never what a link points to")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise OwnershipError(f"{name} is a file, not a folder bertflow made; name a new folder")
    if not any(folder.iterdir()) or _is_work(folder):
        return
    if not (folder / OWNED).is_file():
        raise OwnershipError(f"{name} holds files bertflow did not write (no {OWNED} in it), and it "
                             "replaces only folders it made; name a new folder, or move that one "
                             "away yourself")
    manifest = _read_json(folder / OWNED) or {}
    if manifest.get("bertflow") != "owned" or not isinstance(manifest.get("files"), dict):
        raise OwnershipError(f"{name}: its {OWNED} lists no files (a folder of a bertflow older "
                             "than the manifest, or a marker copied or made by hand), so bertflow "
                             "can't tell its files from yours; look inside, then move the folder "
                             "away or delete it yourself: the next run writes it anew")
    foreign, changed = _differences(folder, manifest)
    if foreign or changed:
        parts = [f"files bertflow did not write ({_some(foreign)})"] if foreign else []
        parts += [f"files changed since bertflow wrote them ({_some(changed)})"] if changed else []
        raise OwnershipError(f"{name} holds {' and '.join(parts)}, and bertflow replaces a folder "
                             "only while every file in it is its own, unchanged; move those files "
                             "away, or name a new folder")


def remove_owned(folder: Path) -> bool:
    """Remove `folder` if every file in it is bertflow's (components.core.guard.claim); True if
    it is gone. The marker goes last, so that a kill part way leaves a folder still marked."""
    folder = Path(folder)
    try:
        claim(folder)
    except OwnershipError:
        return False
    if not folder.exists():
        return True
    for child in folder.iterdir():
        if child.name in MARKERS:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def _is_work(folder: Path) -> bool:
    """Whether `folder` holds a WORK marker made in it (not a copy of one, nor a touched file)."""
    record = _read_json(folder / WORK)
    return (record is not None and record.get("bertflow") == "work"
            and record.get("inode") == folder.stat().st_ino)


def _differences(folder: Path, manifest: dict) -> tuple[list[str], list[str]]:
    """The entries of `folder` its manifest does not list (or lists as another kind), and the
    listed files whose size or digest differ. Listed entries that are gone are no loss: ignored."""
    folders, files = set(manifest.get("folders", [])), manifest["files"]
    foreign, changed = [], []
    for rel, path, kind in _entries(folder, skip=lambda rel: rel not in folders):
        if kind == "folder" and rel in folders:
            continue
        listed = files.get(rel)
        # A link to a file counts as that file: DVC's symlink and hardlink cache types check out
        # outputs that way.
        is_file = kind == "file" or (kind == "a symbolic link" and path.is_file())
        if not is_file or not isinstance(listed, list) or len(listed) != 2:
            foreign.append(rel + ("/" if kind == "folder" else ""))
        elif path.stat().st_size != listed[0] or _sha256(path) != listed[1]:
            changed.append(rel)
    return foreign, changed


def _entries(folder: Path, skip: Callable[[str], bool] = lambda rel: False
             ) -> list[tuple[str, Path, str]]:
    """(relative posix path, path, kind) of everything under `folder` but its top-level markers,
    sorted by path; kind is "folder", "file", "a symbolic link" or "a special file". Links are
    not followed; a folder for which `skip(rel)` holds is listed but not entered."""
    out, stack = [], [folder]
    while stack:
        current = stack.pop()
        for path in current.iterdir():
            rel = path.relative_to(folder).as_posix()
            if current == folder and path.name in MARKERS:
                continue
            if path.is_symlink():
                out.append((rel, path, "a symbolic link"))
            elif path.is_dir():
                out.append((rel, path, "folder"))
                if not skip(rel):
                    stack.append(path)
            else:
                out.append((rel, path, "file" if path.is_file() else "a special file"))
    return sorted(out, key=lambda entry: entry[0])


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_json(path: Path) -> dict | None:
    """`path` as a JSON object; None when it is missing, unreadable or not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _some(names: list[str]) -> str:
    """The first few of `names`, and how many more."""
    more = len(names) - _NAMED
    return ", ".join(names[:_NAMED]) + (f" and {more} more" if more > 0 else "")


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
